"""``kubectl trainop``: day-2 verbs for TrainingJobs and TuningSweeps (the ``trainop`` command, installed
also as the kubectl plugin ``kubectl-trainop``).

    status NAME                     phase, progress, newest checkpoint, network, last failures: one screen
    logs NAME [--rank N] [-f]       the job's log (every rank, or one) from the Ray head's log follower
    checkpoints NAME                the checkpoints on the claim: step, epoch, time, size, loss
    suspend NAME / resume NAME      spec.suspend, with the operator's answer
    restart NAME [--from-step S]    a new attempt from the newest checkpoint (or from step S)

Every verb talks to the cluster through the ``kubectl`` binary (``kubectl.Kubectl``): a plugin is run by
kubectl, so kubectl is there, and going through it means the plugin authenticates exactly as the user's
kubectl does (contexts, exec credential plugins, OIDC), honours ``-n``/``--context``/``--kubeconfig`` the
same way, and needs no Kubernetes client library: the base install (pydantic, PyYAML) is enough.

Modules, one concern each: ``kubectl`` (the transport), ``target`` (NAME to a TrainingJob or a TuningSweep
and its Ray pods), ``status`` (the screen, pure), ``logs``, ``checkpoints`` (and the short-lived pod that
reads or edits the claim when no Ray pod of the job runs), ``lifecycle`` (suspend, resume, restart),
``commands`` (argparse wiring for ``trainop.cli``).
"""
