"""Failure injection, the way it happens on a cluster, through the user's own tools.

- **kill a worker**: ``kubectl exec`` into a worker pod of the attempt's RayCluster and, once a checkpoint
  is committed, SIGKILL one Ray Train worker process (the trainer registers its pids in
  ``$TRAINOP_PID_DIR`` inside the pod), as an OOM kill would. Ray Train restarts the worker group inside
  the attempt (failure layer 1).
- **kill the driver**: the same in the head pod, for the RayJob's entrypoint, as a crash of the driver
  would. The RayJob fails and the operator starts the next attempt (failure layer 2).
- **delete a worker pod** / **delete the head pod**: ``kubectl delete pod``, as a drained or lost node
  would; KubeRay and Ray Train react as they do on any cluster.
- **stop or kill a worker at once** (``signal_worker``): SIGSTOP (a hang: the trainer's watchdog must
  notice) or SIGKILL one Ray Train worker process, without waiting for a checkpoint.
- **preempt a pod** (``delete_pod_gracefully``): ``kubectl delete pod --grace-period=N``, as a spot reclaim
  or a drain; the worker pod's preStop hook checkpoints within the grace period.
- **make user code raise** (``create_file_in_worker``): ``kubectl exec`` creates a file in a worker pod,
  which a user entrypoint that watches for it (``e2e/usercode/faulty_train.py``, ``raiseWhenFileExists``)
  answers by raising ``ValueError``: a user exception at a moment of the caller's choosing.
- **lose a node** (local cluster bed only): the node agent's ``lose-node`` hook kills every process of the
  node's pods and stops the node's Lease and status, as a machine that loses power; the API objects stay
  as they were until the node-lifecycle controller marks the node unreachable.

The pods are found the way a user finds them: the RayJob's ``status.rayClusterName`` and KubeRay's labels
``ray.io/cluster`` and ``ray.io/node-type``. The same code runs on the local cluster bed and on a real
cluster.
"""

from __future__ import annotations

from e2e import cluster as cluster_module
from trainop.controller import rayjob

# Runs inside a Ray pod (the trainer image has Python): wait until the job has a committed checkpoint and
# a process to kill, then SIGKILL it and print the newest checkpoint step. Waiting *inside the pod* is
# what makes the kill land in time on any machine: the tiny e2e job trains hundreds of steps per second,
# faster than an API round trip. Committed means what the trainer in the pod's image says it means
# (``CheckpointStore.committed_steps``: DCP's ``.metadata`` is there).
#   argv: <checkpoints dir> <"worker"|"driver"|"none"> <timeout seconds>   ("none": only wait)
_KILL_AFTER_CHECKPOINT = r"""
import os, pathlib, signal, sys, time
from trainop_trainer.checkpoint_store import CheckpointStore
checkpoints, target, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
pid_dir = os.environ.get("TRAINOP_PID_DIR", "/tmp/trainop/pids")
own_net = os.stat("/proc/self/ns/net").st_ino

def newest_checkpoint():
    # The trainer's own definition of a committed checkpoint (this image's trainop_trainer).
    steps = CheckpointStore(pathlib.Path(checkpoints)).committed_steps()
    return max(steps, default=None)


def victim():
    if target == "none":
        return (0, "nothing")
    if target == "worker":  # a Ray Train worker registered its pid in this pod
        for name in sorted(os.listdir(pid_dir)) if os.path.isdir(pid_dir) else ():
            try:
                return int(open(os.path.join(pid_dir, name)).read().strip()), name
            except (OSError, ValueError):
                continue
        return None
    # the RayJob's entrypoint; only this pod's processes (the node agent gives pods no PID namespace)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            if os.stat(f"/proc/{pid}/ns/net").st_ino != own_net:
                continue
        except OSError:
            continue
        if any(b"trainop_trainer" in a for a in argv) and b"--config" in argv:
            return int(pid), b" ".join(argv).decode()
    return None

deadline = time.monotonic() + timeout
while time.monotonic() < deadline:
    step, found = newest_checkpoint(), victim()
    if step is not None and found is not None:
        if target == "none":
            print(f"found checkpoint step {step}")
            sys.exit(0)
        os.kill(found[0], signal.SIGKILL)
        print(f"killed {found[0]} ({found[1]}) after checkpoint step {step}")
        sys.exit(0)
    time.sleep(0.1)
print(f"no checkpoint and {target} process within {timeout:.0f}s:",
      f"checkpoint {newest_checkpoint()}, process {victim()}")
sys.exit(1)
"""
KILL_WAIT_S = 240

# Runs inside a worker pod: send a signal to one live Ray Train worker process of this pod (a pid the
# trainer registered in ``$TRAINOP_PID_DIR``, alive and not stopped: a group restarted after an earlier
# injection leaves the old files behind) and print its pid.   argv: <signal name, e.g. STOP>
_SIGNAL_WORKER = r"""
import os, signal, sys
pid_dir = os.environ.get("TRAINOP_PID_DIR", "/tmp/trainop/pids")
signum = getattr(signal, "SIG" + sys.argv[1])
for name in sorted(os.listdir(pid_dir)) if os.path.isdir(pid_dir) else ():
    try:
        pid = int(open(os.path.join(pid_dir, name)).read().strip())
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except (OSError, ValueError):
        continue
    if state in ("T", "t", "Z", "X"):
        continue
    os.kill(pid, signum)
    print(f"sent SIG{sys.argv[1]} to Ray Train worker {pid} ({name})")
    sys.exit(0)
print(f"no live Ray Train worker registered in {pid_dir}")
sys.exit(1)
"""


class ClusterFaults:
    """Injects a failure into the RayJob ``ray_job`` of ``namespace``; returns what was done, in words."""

    def __init__(self, cluster: cluster_module.Cluster) -> None:
        self.cluster = cluster

    def kill_after_checkpoint(self, namespace: str, ray_job: str, *, checkpoints: str, target: str) -> str:
        """Once ``checkpoints`` (the path inside the pods) holds a committed checkpoint, SIGKILL a Ray Train
        worker (``target="worker"``, in the last worker pod) or the entrypoint (``"driver"``, in the head);
        ``"none"`` only waits for the checkpoint (in the head)."""
        on_head = target in ("driver", "none")
        pod = self.pods(namespace, ray_job, "head" if on_head else "worker")[-1]
        container = rayjob.HEAD_CONTAINER if on_head else rayjob.WORKER_CONTAINER
        answer = self._python(
            namespace,
            pod,
            container,
            _KILL_AFTER_CHECKPOINT,
            checkpoints,
            target,
            str(KILL_WAIT_S),
            timeout_s=KILL_WAIT_S + 60,
        )
        return f"pod {pod}: {answer}"

    def _python(
        self, namespace: str, pod: str, container: str, script: str, *args: str, timeout_s: float = 120
    ) -> str:
        """Run ``python -c script args...`` in a container of ``pod`` (``kubectl exec``); its output. A
        non-zero exit fails the test, naming the pod."""
        result = self.cluster.kubectl(
            "exec",
            "-n",
            namespace,
            pod,
            "-c",
            container,
            "--",
            "python",
            "-c",
            script,
            *args,
            check=False,
            timeout_s=timeout_s,
        )
        answer = (result.stdout + result.stderr).strip()
        assert result.returncode == 0, f"pod {pod}: {answer}"
        return answer

    def signal_worker(self, namespace: str, ray_job: str, signal_name: str) -> str:
        """Send ``SIG<signal_name>`` (``STOP``: a hang, ``KILL``: a crash) to one live Ray Train worker
        process in the last worker pod of the RayJob's cluster, at once (no checkpoint wait)."""
        pod = self.pods(namespace, ray_job, "worker")[-1]
        answer = self._python(namespace, pod, rayjob.WORKER_CONTAINER, _SIGNAL_WORKER, signal_name)
        return f"pod {pod}: {answer}"

    def create_file_in_worker(self, namespace: str, ray_job: str, path: str) -> str:
        """Create the (empty) file ``path`` inside the last worker pod of the RayJob's cluster, with its
        parent directories (``kubectl exec``)."""
        pod = self.pods(namespace, ray_job, "worker")[-1]
        script = (
            "import pathlib, sys; p = pathlib.Path(sys.argv[1]); p.parent.mkdir(parents=True, exist_ok=True)"
        )
        script += "; p.touch()"
        self._python(namespace, pod, rayjob.WORKER_CONTAINER, script, path)
        return f"pod {pod}: created {path}"

    def delete_pod_gracefully(
        self, namespace: str, ray_job: str, node_type: str, *, grace_period_s: int = 30
    ) -> str:
        """``kubectl delete pod --grace-period`` of the (last) running pod of ``node_type``, as a spot
        reclaim or a drain does: the pod's preStop hook has the grace period to checkpoint."""
        return self.delete_pod(namespace, ray_job, node_type, grace_s=grace_period_s)

    def lose_node(self, node: str) -> str:
        """The node is gone (power lost): its pods' processes die, it stops reporting. Local bed only."""
        bed = getattr(self.cluster, "bed", None)
        if bed is None:
            raise AssertionError(f"losing node {node} needs the local cluster bed's node agent")
        bed.control.lose_node(node)
        return f"node {node} lost (its pods' processes killed, its Lease and status stopped)"

    def node_of(self, namespace: str, pod: str) -> str:
        return str(
            self.cluster.kubectl_json("get", "pod", pod, "-n", namespace)["spec"].get("nodeName") or ""
        )

    def delete_pod(self, namespace: str, ray_job: str, node_type: str, grace_s: int | None = None) -> str:
        """``kubectl delete pod`` of the (last) running pod of ``node_type`` ("head" or "worker"), with the
        pod's own grace period or ``grace_s``."""
        pod = self.pods(namespace, ray_job, node_type)[-1]
        grace = [] if grace_s is None else [f"--grace-period={grace_s}"]
        self.cluster.kubectl("delete", "pod", pod, "-n", namespace, "--wait=false", *grace)
        return f"deleted pod {pod}" + ("" if grace_s is None else f" (grace period {grace_s} s)")

    def pods(self, namespace: str, ray_job: str, node_type: str) -> list[str]:
        """The running pods of ``node_type`` of the RayJob's RayCluster, by name."""
        status = self.cluster.kubectl_json("get", "rayjob", ray_job, "-n", namespace).get("status") or {}
        cluster_name = status["rayClusterName"]
        pods = self.cluster.kubectl_json(
            "get",
            "pods",
            "-n",
            namespace,
            "-l",
            f"ray.io/cluster={cluster_name},ray.io/node-type={node_type}",
        )["items"]
        names = sorted(
            p["metadata"]["name"]
            for p in pods
            if (p.get("status") or {}).get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")
        )
        assert names, f"no running {node_type} pod of RayCluster {cluster_name}"
        return names
