"""Status that never lies, against the real apiserver: one regression test for each untruth an independent
churn found (issue 16), plus the two small ones (a refusal naming its field, the listen address).

KubeRay's part, where a RayJob must get a status, is played by its stand-in (``kuberay_standin``, the
tier's only mock). The kube-controller-manager of the control plane is real: its garbage collector
deletes a deleted job's children, and its PVC-protection controller releases claims.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import operator_factories as factories
import pytest
import yaml
from cluster_api import Api, user_claim, wait_for
from operator_process import OperatorProcess

from tests.controlplane import cluster
from tests.reliability import kube_async

pytestmark = pytest.mark.controlplane

HOLD = "trainop.dev/test-hold"  # a finalizer of the test's: keeps a deleted claim Terminating


def status(api: Api, namespace: str, name: str = "mlp") -> dict[str, Any]:
    body = api.get(api.job(namespace, name))
    return (body or {}).get("status") or {}


def condition(found: dict[str, Any], type_: str) -> dict[str, Any]:
    return {c["type"]: c for c in found.get("conditions") or []}.get(type_, {})


JOBS_PATH = "/apis/trainop.dev/v1alpha1/namespaces/{namespace}/trainingjobs"
RAY_JOBS_PATH = "/apis/ray.io/v1/namespaces/{namespace}/rayjobs"


class _ListingApi(kube_async.AsyncApi):
    """The async client, telling when a watch's initial listing of a path was answered: from then on its
    watch misses nothing (it resumes from that listing's resourceVersion), even if it connects later."""

    listed: dict[str, threading.Event]

    async def request(self, method: str, path: str, body: Any = None, **kwargs: Any) -> dict[str, Any]:
        answer = await super().request(method, path, body, **kwargs)
        if method == "GET" and path in self.listed:
            self.listed[path].set()
        return answer


class Recorder:
    """Every TrainingJob status and every RayJob creation in a namespace, from watches, on a thread."""

    TIMEOUT_S = 10.0

    def __init__(self, plane: cluster.ControlPlane, namespace: str) -> None:
        self.plane = plane
        self.namespace = namespace
        self.named: list[str | None] = []  # status.children.rayJob of every TrainingJob event, in order
        self.created: set[str] = set()  # RayJobs that ever existed
        self.paths = [JOBS_PATH.format(namespace=namespace), RAY_JOBS_PATH.format(namespace=namespace)]
        self._listed = {path: threading.Event() for path in self.paths}
        self._versions: set[tuple[str, str]] = set()  # (uid, resourceVersion) of every object seen
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def _record(self, obj: dict[str, Any], record: Callable[[dict[str, Any]], None]) -> None:
        with self._lock:
            record(obj)
            self._versions.add((obj["metadata"]["uid"], obj["metadata"]["resourceVersion"]))

    async def _run(self) -> None:
        async with _ListingApi.for_plane(self.plane) as api:
            api.listed = self._listed

            async def follow(path: str, record: Callable[[dict[str, Any]], None]) -> None:
                async for kind, obj in api.watch(path):
                    if kind != "DELETED":
                        self._record(obj, record)

            jobs, ray_jobs = self.paths
            tasks = [
                asyncio.create_task(
                    follow(
                        jobs,
                        lambda o: self.named.append(
                            ((o.get("status") or {}).get("children") or {}).get("rayJob")
                        ),
                    )
                ),
                asyncio.create_task(follow(ray_jobs, lambda o: self.created.add(o["metadata"]["name"]))),
            ]
            while not self._stop.is_set():
                await asyncio.sleep(0.05)
            await kube_async.cancel(*tasks)

    def _unseen(self, api: Api) -> list[str]:
        """Objects whose current version (as the apiserver has it now) the watches have not delivered."""
        current = [o for path in self.paths for o in api.list(path)]
        with self._lock:
            return [
                f"{o['kind']} {o['metadata']['name']} at {o['metadata']['resourceVersion']}"
                for o in current
                if (o["metadata"]["uid"], o["metadata"]["resourceVersion"]) not in self._versions
            ]

    def __enter__(self) -> Recorder:
        self._thread.start()
        deadline = time.monotonic() + self.TIMEOUT_S
        for path, listed in self._listed.items():
            if not listed.wait(timeout=max(0.0, deadline - time.monotonic())):
                self._stop.set()
                raise AssertionError(f"the recorder's watch of {path} never got its initial listing")
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        try:
            if exc_type is None:  # the last events arrive: the watches caught up with the apiserver
                wait_for(
                    lambda: self._unseen(Api(self.plane)),
                    lambda unseen: not unseen,
                    timeout_s=self.TIMEOUT_S,
                    what="the recorder's watches to deliver every object's current version",
                )
        finally:
            self._stop.set()
            self._thread.join(timeout=10)


def test_a_missing_existing_claim_starts_no_pods_and_its_creation_wakes_the_job_at_once(
    operator: OperatorProcess, api: Api, apply: Any, namespace: str
) -> None:
    apply(factories.manifest("mlp", namespace, spec={"checkpoint": {"storage": {"existingClaim": "shared"}}}))
    waiting = wait_for(
        lambda: status(api, namespace),
        lambda s: condition(s, "StorageReady").get("reason") == "ClaimNotFound",
        what="ClaimNotFound",
    )
    running = condition(waiting, "Running")
    assert (waiting["phase"], running["reason"]) == ("Pending", "WaitingForStorage")
    assert "claim shared" in running["message"]
    assert "rayJob" not in waiting["children"] and "persistentVolumeClaim" not in waiting["children"]
    time.sleep(1.0)  # had the operator been going to create one, it would have by now
    assert api.list(api.ray_jobs(namespace)) == []
    assert api.list(f"/apis/ray.io/v1/namespaces/{namespace}/rayclusters") == []

    # The user's claim carries no label of ours; it must wake the job anyway, without an operator restart.
    api.create(api.core(namespace, "persistentvolumeclaims"), user_claim("shared"))
    started = wait_for(
        lambda: status(api, namespace),
        lambda s: (s.get("children") or {}).get("rayJob") == "mlp-a1",
        timeout_s=20,
        what="the RayJob once the claim exists",
    )
    assert condition(started, "StorageReady")["reason"] == "ClaimPending"
    assert started["children"]["persistentVolumeClaim"] == "shared"
    # The status is written before the children it names (a crash in between is then repaired from it):
    # the RayJob follows within the same reconcile.
    wait_for(
        lambda: api.get(api.ray_jobs(namespace, "mlp-a1")),
        lambda r: r is not None,
        timeout_s=20,
        what="RayJob mlp-a1 after the status named it",
    )


def test_a_job_recreated_while_its_namesakes_claim_is_being_deleted_says_so_and_waits_for_it(
    operator: OperatorProcess, api: Api, apply: Any, namespace: str
) -> None:
    manifest = factories.manifest("mlp", namespace, spec={"checkpoint": {"storage": {"deleteWithJob": True}}})
    apply(manifest)
    claim_path = api.core(namespace, "persistentvolumeclaims", "mlp-ckpt")
    wait_for(lambda: api.get(claim_path), lambda c: c is not None, what="the first job's claim")
    api.patch(claim_path, {"metadata": {"finalizers": [HOLD]}})
    api.delete(api.job(namespace, "mlp"))
    wait_for(  # the garbage collector deletes the claim with its job; the test's finalizer holds it
        lambda: api.get(claim_path),
        lambda c: c is not None and bool(c["metadata"].get("deletionTimestamp")),
        what="the claim Terminating",
    )
    wait_for(lambda: api.get(api.job(namespace, "mlp")), lambda j: j is None, what="the first job gone")
    wait_for(lambda: api.list(api.ray_jobs(namespace)), lambda r: r == [], what="its RayJob gone")

    apply(manifest)  # the same name again
    waiting = wait_for(
        lambda: status(api, namespace),
        lambda s: condition(s, "StorageReady").get("reason") == "ClaimBeingDeleted",
        what="ClaimBeingDeleted",
    )
    assert waiting["phase"] == "Pending"
    assert condition(waiting, "Running")["reason"] == "WaitingForStorage"
    assert "rayJob" not in waiting["children"] and "persistentVolumeClaim" not in waiting["children"]
    assert api.list(api.ray_jobs(namespace)) == []

    api.patch(claim_path, {"metadata": {"finalizers": None}})  # the old claim goes
    started = wait_for(
        lambda: status(api, namespace),
        lambda s: (s.get("children") or {}).get("rayJob") == "mlp-a1",
        what="the new job's RayJob",
    )
    assert condition(started, "StorageReady")["reason"] == "ClaimPending"
    new_claim = api.get(claim_path)
    owner_uid = api.get(api.job(namespace, "mlp"))["metadata"]["uid"]  # type: ignore[index]
    assert new_claim is not None and [r["uid"] for r in new_claim["metadata"]["ownerReferences"]] == [
        owner_uid
    ]


def test_suspending_and_resuming_before_any_rayjob_exists_never_names_one_that_was_not_created(
    operator: OperatorProcess, api: Api, apply: Any, namespace: str, control_plane: cluster.ControlPlane
) -> None:
    spec = {"checkpoint": {"storage": {"existingClaim": "shared"}}}
    with Recorder(control_plane, namespace) as seen:
        apply(factories.manifest("mlp", namespace, spec=spec))
        wait_for(lambda: status(api, namespace), lambda s: s.get("phase") == "Pending", what="Pending")
        for _ in range(2):
            apply(factories.manifest("mlp", namespace, spec={**spec, "suspend": True}))
            wait_for(
                lambda: status(api, namespace), lambda s: s.get("phase") == "Suspended", what="Suspended"
            )
            apply(factories.manifest("mlp", namespace, spec=spec))
            wait_for(lambda: status(api, namespace), lambda s: s.get("phase") == "Pending", what="resumed")
        assert status(api, namespace)["attempt"] == 3
        api.create(api.core(namespace, "persistentvolumeclaims"), user_claim("shared"))
        wait_for(lambda: api.get(api.ray_jobs(namespace, "mlp-a3")), lambda r: r is not None, what="mlp-a3")
    assert seen.created == {"mlp-a3"}  # no attempt that could not start got a RayJob
    named = {name for name in seen.named if name is not None}
    assert named == {"mlp-a3"}, seen.named  # and the status never named a RayJob that did not exist


def test_delete_with_job_adopts_a_claim_found_under_the_jobs_name_so_it_goes_with_the_job(
    operator: OperatorProcess, api: Api, apply: Any, namespace: str
) -> None:
    api.create(api.core(namespace, "persistentvolumeclaims"), user_claim("mlp-ckpt"))  # e.g. kept from before
    apply(factories.manifest("mlp", namespace, spec={"checkpoint": {"storage": {"deleteWithJob": True}}}))
    claim_path = api.core(namespace, "persistentvolumeclaims", "mlp-ckpt")
    adopted = wait_for(
        lambda: api.get(claim_path),
        lambda c: c is not None and bool(c["metadata"].get("ownerReferences")),
        what="the claim adopted",
    )
    owner = api.get(api.job(namespace, "mlp"))
    assert owner is not None
    assert [r["uid"] for r in adopted["metadata"]["ownerReferences"]] == [owner["metadata"]["uid"]]
    events = api.list(f"/api/v1/namespaces/{namespace}/events")
    assert [e["reason"] for e in events if e["reason"] == "ClaimAdopted"] == ["ClaimAdopted"]
    api.delete(api.job(namespace, "mlp"))
    wait_for(
        lambda: api.get(claim_path),
        lambda c: c is None or bool(c["metadata"].get("deletionTimestamp")),
        what="the claim deleted with its job",
    )


def test_a_name_over_40_characters_is_refused_naming_metadata_name(
    control_plane: cluster.ControlPlane, namespace: str
) -> None:
    manifest = factories.manifest("a" * 41, namespace)
    result = control_plane.kubectl("create", "-f", "-", input=yaml.safe_dump(manifest), check=False)
    assert result.returncode != 0
    assert "* metadata.name: Too long: may not be more than 40 bytes" in result.stderr, result.stderr
    # The apiserver adds a line of its own, "<nil>: ... some validation rules were not checked because the
    # object was invalid" (the spec's CEL rules, skipped); none about the name is pathless any more.
    assert not [line for line in result.stderr.splitlines() if "<nil>" in line and "name" in line]


def _listening(port: int) -> set[str]:
    """Local addresses listening on ``port`` (IPv4, from /proc/net/tcp: state 0A is LISTEN)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, _, hex_port = local.partition(":")
        if state == "0A" and int(hex_port, 16) == port:
            found.add(".".join(str(int(address[i : i + 2], 16)) for i in (6, 4, 2, 0)))
    return found


@pytest.fixture
def stopped_after(dedicated_operator: OperatorProcess) -> Iterator[OperatorProcess]:
    yield dedicated_operator
    dedicated_operator.stop()


def test_the_liveness_and_metrics_endpoints_listen_where_told(
    stopped_after: OperatorProcess, namespace: str
) -> None:
    stopped_after.start(namespaces=[namespace], extra_args=["--listen-address=127.0.0.1"])
    assert _listening(stopped_after.liveness_port) == {"127.0.0.1"}
    assert _listening(stopped_after.metrics_port) == {"127.0.0.1"}
    stopped_after.stop()
    stopped_after.start(namespaces=[namespace])
    assert _listening(stopped_after.liveness_port) == {"0.0.0.0"}
    assert _listening(stopped_after.metrics_port) == {"0.0.0.0"}
