"""The trainop operator: reconciles TrainingJobs and TuningSweeps into KubeRay RayJobs and their children.

Layers, each a module with one concern (imported as modules, names used qualified):

    kinds, meta           what differs per kind; names, labels, owner references          pure
    acceptance            which spec runs (re-validation, immutable fields)                 pure
    children, rayjob      desired children: claim, ConfigMap, RBAC, RayJob                  pure
    observe               RayJob/claim/pod JSON -> observations                             pure
    state_machine,        the phase state machine -> Transition; conditions                 pure
      conditions
    kube, apply, events   the API: dict client, server-side apply / create-only, Events      I/O
    incarnation           writes to the owner itself, refused once it is another object     I/O
    reconcile             read -> decide -> write, for one owner                            I/O
    cache, own_writes     children as the watches show them; what this process wrote         memory
    workqueue, engine     keyed queue, workers, routing of watch events                     runtime
    handlers, main        kopf handlers and indexes, and the process (``run``)             runtime
    metrics, failpoints   Prometheus series; crash points for kill-recovery tests

Nothing here registers kopf handlers at import time: ``main.run`` builds a private registry.
"""
