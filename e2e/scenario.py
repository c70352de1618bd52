"""One scenario: a namespace, the manifest a user applies, and everything they would watch while it runs.

``Environment`` is the session's installed system (cluster, chart and its operator, the failure injector,
the claim reader, and on the local bed an S3 server the pods reach). ``Scenario`` is one test's view of
it: ``apply`` runs ``kubectl apply -f`` and starts three real ``kubectl --watch`` streams (the owner, its
RayJobs, the namespace's Events) that feed the timeline; ``wait_for`` blocks on the owner's stream;
``history`` is every version of the owner that kubectl printed, with the second it arrived, for
assertions about how the columns moved.

Scenarios run concurrently: almost all of a scenario's time is Ray and torch starting up processes, which
overlaps well. A test declares what a user *does* as a script (``@acts(script)``: apply, wait, inject a
failure; it returns the facts it observed); the session starts every selected test's script at once in
its own thread (``ScriptRun``; ``E2E_CONCURRENCY`` caps how many act at a time), and each test then waits
for its own script and asserts on the outcome. One behaviour per test, as before; only the waiting
overlaps.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from e2e import claims, faults, install
from e2e import cluster as cluster_module
from e2e import watch as watch_module
from tests.objectstore.server import S3Server
from trainop.api import trainer_config

Obj = dict[str, Any]

OWNER_LABEL = {"TrainingJob": "trainop.dev/job", "TuningSweep": "trainop.dev/sweep"}
PLURAL = {"TrainingJob": "trainingjobs", "TuningSweep": "tuningsweeps"}
ATTEMPT_PREFIX = {"TrainingJob": "a", "TuningSweep": "s"}
CHILD_SUFFIX = {"TrainingJob": "-trainer", "TuningSweep": "-sweep"}
CLAIM_SUFFIX = {"TrainingJob": "-ckpt", "TuningSweep": "-sweep-ckpt"}


@dataclasses.dataclass
class Environment:
    cluster: cluster_module.Cluster
    release: install.Release
    faults: faults.ClusterFaults
    claims: claims.ClaimFiles
    work_dir: Path
    #: versitygw on the bed's root address (pods reach it); None on a real cluster.
    object_store: S3Server | None = None

    @property
    def operator_identity(self) -> str:
        return f"system:serviceaccount:{self.release.namespace}:{self.release.service_account}"


class Scenario:
    def __init__(self, env: Environment, namespace: str, title: str) -> None:
        self.env = env
        self.cluster = env.cluster
        self.namespace = namespace
        self.timeline = watch_module.Timeline(title)
        self.events = watch_module.KubectlWatch(
            self.cluster,
            "events",
            namespace=namespace,
            clock=self.timeline.clock,
            on_object=self.timeline.observe_event,
        ).start()
        self.owner: watch_module.KubectlWatch | None = None
        self.ray_jobs: watch_module.KubectlWatch | None = None
        self.kind = ""
        self.name = ""
        self.document: Obj = {}
        self.columns: watch_module.PrinterColumns | None = None
        self.saved_driver_logs: dict[str, str] | None = None  # read when the script failed (conftest)

    # ------------------------------------------------------------------------------------------- acting
    def apply(self, manifest: Path, edit: Callable[[Obj], list[str]] | None = None) -> Obj:
        """``kubectl apply -f manifest -n <ns>``, then watch the owner and its RayJobs.

        On a real cluster ``E2E_TRAINER_IMAGE`` and ``E2E_GPUS_PER_WORKER`` adapt the manifest (image,
        GPUs per worker); ``edit`` fills in what only the session knows (a bucket, an endpoint) and says
        what it changed. The applied document is ``self.document``."""
        original: Obj = yaml.safe_load(manifest.read_text())
        self.document, changes = customize(original)
        if edit is not None:
            changes += edit(self.document)
        self.kind, self.name = self.document["kind"], self.document["metadata"]["name"]
        plural = PLURAL[self.kind]
        self.columns = watch_module.PrinterColumns.of(self.cluster, f"{plural}.trainop.dev")
        self.timeline.follow(self.kind, self.columns)
        if changes:
            applied = self.env.work_dir / f"{self.namespace}-{manifest.name}"
            applied.write_text(yaml.safe_dump(self.document, sort_keys=False))
        else:
            applied = manifest
        shown = manifest.relative_to(cluster_module.REPO_ROOT)
        self.timeline.note(f"kubectl apply -f {shown}" + (f" ({', '.join(changes)})" if changes else ""))
        self.cluster.kubectl("apply", "-n", self.namespace, "-f", str(applied))
        self.owner = watch_module.KubectlWatch(
            self.cluster,
            plural,
            namespace=self.namespace,
            name=self.name,
            clock=self.timeline.clock,
            on_object=self.timeline.observe_owner,
        ).start()
        self.ray_jobs = watch_module.KubectlWatch(
            self.cluster,
            "rayjobs",
            namespace=self.namespace,
            selector=f"{OWNER_LABEL[self.kind]}={self.name}",
            clock=self.timeline.clock,
            on_object=self.timeline.observe_ray_job,
        ).start()
        return self.document

    def ray_job(self, attempt: int) -> str:
        return f"{self.name}-{ATTEMPT_PREFIX[self.kind]}{attempt}"

    @property
    def claim(self) -> str:
        return f"{self.name}{CLAIM_SUFFIX[self.kind]}"

    @property
    def trainer_identity(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.name}{CHILD_SUFFIX[self.kind]}"

    def kill_worker(self, attempt: int) -> int:
        """SIGKILL a Ray Train worker of ``attempt`` right after its first committed checkpoint; raises
        unless it was done. Returns the newest checkpoint step at the kill."""
        return self._kill(attempt, "worker", "a Ray Train worker")

    def kill_driver(self, attempt: int) -> int:
        """SIGKILL the entrypoint of ``attempt`` right after its first committed checkpoint; raises unless
        it was done. Returns the newest checkpoint step at the kill."""
        return self._kill(attempt, "driver", "the entrypoint")

    def _kill(self, attempt: int, target: str, what: str) -> int:
        self.timeline.note(
            f"inject: kill {what} of {self.ray_job(attempt)} after a checkpoint (kubectl exec)"
        )
        answer = self._noted(
            self.env.faults.kill_after_checkpoint(
                self.namespace, self.ray_job(attempt), checkpoints=self._checkpoints(), target=target
            )
        )
        return int(answer.rsplit("checkpoint step ", 1)[1].split()[0])

    def lose_node(self, node: str) -> str:
        """The node is gone (local bed): every process of its pods dies, it stops reporting."""
        self.timeline.note(f"inject: lose node {node} (node agent hook)")
        return self._noted(self.env.faults.lose_node(node))

    def wait_for_checkpoint_on_volume(self, attempt: int) -> int:
        """Wait (inside the head pod: no API round trips) until the job has a committed checkpoint on its
        volume; returns the newest checkpoint step."""
        self.timeline.note(f"wait in the head pod of {self.ray_job(attempt)} for a committed checkpoint")
        answer = self._noted(
            self.env.faults.kill_after_checkpoint(
                self.namespace, self.ray_job(attempt), checkpoints=self._checkpoints(), target="none"
            )
        )
        return int(answer.rsplit("checkpoint step ", 1)[1].split()[0])

    def patch_spec(self, patch: dict[str, Any]) -> None:
        """``kubectl patch --type merge`` of the owner's spec, as a user changes a running job."""
        self.timeline.note(f"kubectl patch {PLURAL[self.kind]} {self.name} spec {json.dumps(patch)}")
        self.cluster.kubectl(
            "patch",
            PLURAL[self.kind],
            self.name,
            "-n",
            self.namespace,
            "--type",
            "merge",
            "-p",
            json.dumps({"spec": patch}),
        )

    def wait_for_object(
        self, resource: str, name: str, predicate: Callable[[Obj], bool], *, timeout_s: float, what: str
    ) -> Obj:
        """``kubectl get`` of one object of the namespace, again every second until ``predicate`` holds."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = self.cluster.kubectl(
                "get", resource, name, "-n", self.namespace, "-o", "json", check=False
            )
            obj: Obj = json.loads(found.stdout) if found.returncode == 0 else {}
            if obj and predicate(obj):
                return obj
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out after {timeout_s:.0f}s waiting for {what}: {obj or found.stderr}"
                )
            time.sleep(1)

    def wait_until_no_ray_pods(self, *, timeout_s: float) -> int:
        """Wait until the namespace has no Ray pod left (KubeRay deleted the cluster); returns how many are
        left at the end (0, or the count when the time ran out)."""
        deadline = time.monotonic() + timeout_s
        while True:
            pods = self.cluster.kubectl_json(
                "get", "pods", "-n", self.namespace, "-l", "ray.io/is-ray-node=yes"
            )
            left = len(pods["items"])
            if left == 0 or time.monotonic() > deadline:
                self.timeline.note(f"Ray pods left in the namespace: {left}")
                return left
            time.sleep(1)

    def _checkpoints(self) -> str:
        # The trainer's run is named after the job.
        return f"{trainer_config.CHECKPOINT_MOUNT_PATH}/{self.name}/checkpoints"

    def delete_pod(self, attempt: int, node_type: str, grace_s: int | None = None) -> str:
        """``kubectl delete pod`` of a running ``node_type`` pod ("head"/"worker") of ``attempt``."""
        self.timeline.note(f"inject: kubectl delete pod, a {node_type} of {self.ray_job(attempt)}")
        return self._noted(
            self.env.faults.delete_pod(self.namespace, self.ray_job(attempt), node_type, grace_s=grace_s)
        )

    def release(self) -> None:
        """Delete the scenario's job if it is still going when its script ends (``--wait=false``).

        Scenarios share the bed's nodes two at a time (``E2E_CONCURRENCY``): a job left Pending or
        Provisioning on purpose (a GPU no node has, an image that cannot be pulled, a job wider than its
        claim's node) would hold its placed pods' CPUs until the session ends and starve the scenarios
        queued behind it (CI, 2026-11-26: a sweep waited 4 minutes on "Insufficient cpu"). A finished
        job's Ray cluster is already gone (``shutdownAfterJobFinishes``); it stays for the test to read."""
        if self.owner is None:
            return
        latest = self.owner.latest() or {}
        if phase(latest) in ("Succeeded", "Failed"):
            return
        self.timeline.note(f"kubectl delete {PLURAL[self.kind]} {self.name} (script over: frees its pods)")
        self.cluster.kubectl(
            "delete", PLURAL[self.kind], self.name, "-n", self.namespace, "--wait=false", check=False
        )

    def _noted(self, answer: str) -> str:
        self.timeline.note(f"  {answer}")
        return answer

    # ----------------------------------------------------------------------------------------- watching
    def wait_for(self, predicate: Callable[[Obj], bool], *, timeout_s: float, what: str) -> Obj:
        assert self.owner is not None, "apply a manifest first"
        try:
            return self.owner.wait_for(predicate, timeout_s=timeout_s, what=what)
        except AssertionError as error:
            latest = self.owner.latest() or {}
            raise AssertionError(
                f"{error}\nlast status seen: {yaml.safe_dump(latest.get('status'), sort_keys=False)}"
            ) from None

    def wait_for_ray_job(self, name: str, state: tuple[str, str], *, timeout_s: float = 60) -> Obj:
        """The RayJob ``name`` as its watch shows it once (jobDeploymentStatus, jobStatus) is ``state``."""
        assert self.ray_jobs is not None
        found: Obj = self.ray_jobs.wait_for(
            lambda obj: (
                obj["metadata"]["name"] == name
                and (
                    str((obj.get("status") or {}).get("jobDeploymentStatus") or ""),
                    str((obj.get("status") or {}).get("jobStatus") or ""),
                )
                == state
            ),
            timeout_s=timeout_s,
            what=f"RayJob {name} in state {state}",
        )
        return found

    def wait_until_finished(self, *, timeout_s: float) -> Obj:
        """The first version whose phase is final (Succeeded or Failed)."""
        return self.wait_for(
            lambda obj: phase(obj) in ("Succeeded", "Failed"), timeout_s=timeout_s, what="a final phase"
        )

    def history(self) -> list[watch_module.Sample]:
        assert self.owner is not None
        return list(self.owner.samples)

    def column_history(self) -> list[tuple[float, dict[str, Any]]]:
        """What ``kubectl get`` showed, version by version: (seconds, {column name: value})."""
        assert self.columns is not None
        return [(sample.seconds, self.columns.values(sample.obj)) for sample in self.history()]

    def ray_job_states(self) -> dict[str, list[tuple[str, str]]]:
        """Every (jobDeploymentStatus, jobStatus) each RayJob of the owner went through, in order."""
        assert self.ray_jobs is not None
        states: dict[str, list[tuple[str, str]]] = {}
        for sample in self.ray_jobs.samples:
            status = sample.obj.get("status") or {}
            state = (str(status.get("jobDeploymentStatus") or ""), str(status.get("jobStatus") or ""))
            seen = states.setdefault(sample.obj["metadata"]["name"], [])
            if not seen or seen[-1] != state:
                seen.append(state)
        return states

    def get(self) -> Obj:
        """A fresh read with managedFields (``kubectl get -o json --show-managed-fields``)."""
        stored: Obj = self.cluster.kubectl_json(
            "get", PLURAL[self.kind], self.name, "-n", self.namespace, "--show-managed-fields"
        )
        return stored

    def finish(self) -> str:
        """Stop watching; the timeline plus the final ``kubectl get -o wide`` table."""
        table = ""
        if self.kind:
            table = self.cluster.kubectl(
                "get", PLURAL[self.kind], "-n", self.namespace, "-o", "wide", check=False
            ).stdout
        for stream in (self.owner, self.ray_jobs, self.events):
            if stream is not None:
                stream.stop()
        rendered = self.timeline.render()
        if table:
            rendered += f"\n\n$ kubectl get {PLURAL[self.kind]} -o wide\n{table.rstrip()}"
        return rendered


TRAINER_IMAGE_ENV = "E2E_TRAINER_IMAGE"
GPUS_PER_WORKER_ENV = "E2E_GPUS_PER_WORKER"


def customize(document: Obj) -> tuple[Obj, list[str]]:
    """The manifest with the trainer image and GPUs of the cluster under test (environment), and what
    changed, in words. Unchanged when neither variable is set (the local cluster)."""
    changed = yaml.safe_load(yaml.safe_dump(document))
    spec = changed["spec"]["template"] if changed["kind"] == "TuningSweep" else changed["spec"]
    changes = []
    image = os.environ.get(TRAINER_IMAGE_ENV)
    if image:
        spec["image"] = image
        changes.append(f"image={image}")
    gpus = int(os.environ.get(GPUS_PER_WORKER_ENV) or 0)
    if gpus:
        spec["workers"]["gpusPerWorker"] = gpus
        changes.append(f"gpusPerWorker={gpus}")
    return changed, changes


def world_size(document: Obj) -> int:
    """DDP ranks of a TrainingJob: one per GPU, or one per worker on CPU (trainop_trainer.config)."""
    workers = document["spec"]["workers"]
    return int(workers["replicas"]) * max(1, int(workers.get("gpusPerWorker", 0)))


def phase(obj: Obj) -> str:
    return str((obj.get("status") or {}).get("phase") or "")


def managed_status_fields(obj: Obj, manager: str) -> set[str]:
    """Top-level ``status`` keys owned by ``manager`` on the status subresource (from managedFields)."""
    owned: set[str] = set()
    for entry in obj["metadata"].get("managedFields") or ():
        if entry.get("manager") != manager or entry.get("subresource") != "status":
            continue
        status = (entry.get("fieldsV1") or {}).get("f:status") or {}
        owned |= {key.removeprefix("f:") for key in status if key.startswith("f:")}
    return owned


Script = Callable[[Scenario], dict[str, Any]]


TestFunction = TypeVar("TestFunction", bound=Callable[..., None])


def acts(script: Script) -> Callable[[TestFunction], TestFunction]:
    """Mark a test with the script a user performs in it; the test's ``e2e_script.outcome()`` is
    ``(scenario, facts)``."""
    import pytest

    # with_args: a mark called with one callable would take it for the function being marked.
    mark: Callable[[TestFunction], TestFunction] = pytest.mark.e2e_script.with_args(script)
    return mark


class ScriptRun:
    """One test's script, running in a thread from session start; ``result`` hands its outcome to the test."""

    def __init__(
        self,
        scenario: Scenario,
        script: Script,
        gate: threading.Semaphore,
        on_error: Callable[[Scenario], None] | None = None,
    ) -> None:
        self.scenario = scenario
        self.script = script
        self.gate = gate
        self.on_error = on_error
        self.facts: dict[str, Any] = {}
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name=f"scenario-{scenario.namespace}", daemon=True)

    def start(self) -> ScriptRun:
        self.thread.start()
        return self

    def _main(self) -> None:
        with self.gate:
            self.scenario.timeline.restart()
            try:
                self.facts = self.script(self.scenario)
            except BaseException as error:  # re-raised in the test, with its traceback
                self.error = error
                if self.on_error is not None:  # diagnostics read from the pods before they go
                    self.on_error(self.scenario)
            finally:
                # Before the gate opens for the next scenario: its pods must not wait on this one's.
                self.scenario.release()

    def outcome(self, *, timeout_s: float = 900) -> tuple[Scenario, dict[str, Any]]:
        """Wait for the script; ``(scenario, facts)``, or the script's own exception."""
        self.thread.join(timeout_s)
        if self.thread.is_alive():
            raise AssertionError(f"the scenario's script still runs after {timeout_s:.0f}s")
        if self.error is not None:
            raise self.error
        return self.scenario, self.facts
