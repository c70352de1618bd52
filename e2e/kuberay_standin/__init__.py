"""STAND-IN for KubeRay's Go controller (and, for Ray's pods, the kubelet): the one fake part of the e2e tier.

KubeRay cannot run here: there is no kubelet, no container runtime, no image. This program honours the
RayJob contract the operator relies on, on the local machine, and says so in everything it writes (field
manager and Event source ``kuberay-standin``). Everything else in a scenario is real: the apiserver, helm,
kubectl, the operator, RBAC, Ray, Ray Train, torch DDP.

Per RayJob (``ray.io/v1``, followed cluster-wide with a watch, never polled):

1. **Status as KubeRay v1.5 writes it** (HTTPMode, ``backoffLimit: 0``): ``jobDeploymentStatus``
   Initializing (with ``jobId``, ``rayClusterName``, ``startTime``, ``failed``/``succeeded`` 0) -> Running
   with ``jobStatus`` PENDING -> RUNNING once the entrypoint runs -> SUCCEEDED + Complete, or FAILED + Failed
   with ``reason: AppFailed`` and Ray's message ("Job entrypoint command failed with exit code N, last
   available logs ..."), ``endTime``, ``rayJobInfo`` and ``succeeded``/``failed`` 1. (``controller``)
2. **The head pod, as a local process** (``pod``). Volumes of the head group's pod template become
   directories: a ``persistentVolumeClaim`` is ``<state>/pvs/<namespace>/<claim>`` (so checkpoints outlive
   the RayJob and attempt N+1 finds them, as on a real volume; the first mount binds the claim to a
   hostPath PersistentVolume of that directory, as a WaitForFirstConsumer class would), a ``configMap`` is
   written out, an ``emptyDir`` is an empty directory. ``spec.entrypoint`` is split as a shell would and
   started with each argument and environment value that lies under a ``mountPath`` rewritten to the local
   directory (``--config /etc/trainop/trainer.json`` -> ``<pod>/volumes/head/trainer-config/trainer.json``).
   That gives the two overrides trainop's trainer honours (``trainop.api.trainer_config``):
   ``TRAINOP_CONFIG`` (from the container's env) and ``TRAINOP_STORAGE_PATH`` (the config's
   ``storagePath``, rewritten).
3. **The pods' identity.** A TokenRequest token of the pod template's ``serviceAccountName`` (what the
   kubelet would mount) is written to ``<pod>/serviceaccount/token`` and handed over the way the trainer
   reads credentials outside a pod: ``TRAINOP_KUBE_HOST``, ``TRAINOP_KUBE_TOKEN_FILE``,
   ``TRAINOP_KUBE_CA_FILE`` (trainop_trainer/status.py). No other credential reaches a job: ``KUBECONFIG``
   names a file that does not exist, so the trainer's status patches pass the RBAC the operator created
   for the job, or fail.
4. **The worker pods' environment.** One local Ray cluster serves every RayJob (``ray start --head
   --num-cpus=N``, started once; ``ray_runtime``); ``RAY_ADDRESS`` is exported to every entrypoint, as
   KubeRay does on the head. What differs per job — the worker container's env (NCCL variables,
   ``TRAINOP_CONFIG``) and the credentials above — reaches that job's Ray workers through the job-level
   runtime environment (``RAY_JOB_CONFIG_JSON_ENV_VAR``: what Ray's own job supervisor sets for the driver
   of a job submitted to the dashboard, as KubeRay's HTTPMode does), which every task and actor of the job
   inherits.
5. **Failures on request**, by annotating the RayJob (``kubectl annotate rayjob NAME
   e2e.trainop.dev/kill-worker=<any new value>``; each value is served once): ``kill-worker`` sends SIGKILL
   to the Ray Train worker of the highest rank (its pid is registered in ``TRAINOP_PID_DIR``, one directory
   per RayJob), like an OOM kill; Ray Train restarts the worker group inside the attempt. ``kill-driver``
   sends SIGKILL to the entrypoint, like a lost head pod: the RayJob becomes FAILED. Each request is
   answered with a Warning Event on the RayJob (reason ``WorkerKilled`` / ``DriverKilled``) naming it.
6. **Deletion**: a deleted RayJob (the operator deletes failed attempts) has its entrypoint stopped
   (SIGTERM, then SIGKILL after a grace period), as the pods of KubeRay's deleted RayCluster would be.

Not done: RayCluster objects and pods, ``rayClusterStatus``, ``suspend``, pod resources
(Ray's logical CPUs are ``--num-cpus``, more than this machine's cores: Ray Tune + Train deadlock with too
few), one process per Ray pod (every Ray worker is a process of the one local Ray cluster).

Run: ``python -m e2e.kuberay_standin --kubeconfig FILE --state-dir DIR [--num-cpus N]``; it writes
``DIR/ready`` once Ray runs and RayJobs are listed, and on SIGTERM stops the entrypoints, then Ray.
``launcher.StandInProcess`` runs it for a test session.
"""

ANNOTATION_KILL_WORKER = "e2e.trainop.dev/kill-worker"
ANNOTATION_KILL_DRIVER = "e2e.trainop.dev/kill-driver"
FIELD_MANAGER = "kuberay-standin"
