"""Property: whatever TrainingJob manifest a user throws at the cluster, the apiserver and ``trainop
validate`` give the same verdict, and the operator neither crashes nor loops hot on what is admitted.

Manifests are the test suite's small valid job (``operator_factories.JOB_SPEC``) with one to three
mutations drawn by hypothesis over the fields of our own CRD schema (``crds/``): values inside and just
outside each field's bounds, enum members and arbitrary strings, strings matching and not matching each
pattern, wrong JSON types (quoted numbers and booleans included), nulls, deleted fields and unknown keys.
Each goes to the real apiserver, whose verdict is the oracle (it is not our code):

- sent as kubectl sends (``fieldValidation=Strict``): the apiserver refuses exactly the manifests the
  models (``manifest.parse_object``, what ``trainop validate`` runs) refuse. A manifest the apiserver
  refuses and the models accept means ``trainop validate`` is laxer than ``kubectl apply``; the reverse
  means a rule is missing from the CRD (TrainingJob has no operator-only rule, docs/api.md);
- sent without it (unknown fields pruned, as older clients do): whatever the apiserver stores, the models
  accept, so the operator never meets an invalid TrainingJob.

Every admitted job must then reach ``SpecValid=True`` and never ``InvalidSpec``. Across all examples the
operator process stays up and live, logs no traceback (an unexpected exception is a bug even when
retried), and once everything settled its reconcile counter stands still.

Examples are new on every run (tests/property_seed.py prints the seed that replays them).
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import operator_factories as factories
import pytest
import yaml
from cluster_api import Api, ApiError
from hypothesis import HealthCheck, example, given, seed, settings
from hypothesis import strategies as st

from tests import property_seed
from tests.controlplane import cluster
from tests.reliability import operator_runner
from trainop.api import base, manifest
from trainop.controller import kinds

pytestmark = [pytest.mark.controlplane, pytest.mark.slow]

CRD = Path(__file__).resolve().parents[2] / "crds" / "trainop.dev_trainingjobs.yaml"
SPEC_SCHEMA = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"][
    "properties"
]["spec"]
EXAMPLES = int(os.environ.get("TRAINOP_BAD_INPUT_EXAMPLES", "8"))
BATCH = 8  # manifests per example, applied together: the operator settles them at once


def leaves(
    schema: dict[str, Any], path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], dict[str, Any]]]:
    """Every field of the spec schema that is not a plain nested object, with its schema."""
    if schema.get("type") == "object" and "properties" in schema:
        yield path, schema  # the object itself: for unknown keys and wrong types
        for key, sub in schema["properties"].items():
            yield from leaves(sub, (*path, key))
    else:
        yield path, schema


FIELDS = [(path, schema) for path, schema in leaves(SPEC_SCHEMA) if path]
# Fields the cross-field rules read (the models' validators and the CRD's CEL twins): half of the
# mutations pick from these, where a rule missing on one side would show.
CROSS_FIELD = {
    ("precision",),
    ("workers", "gpusPerWorker"),
    ("workload", "model"),
    ("workload", "entrypoint"),
    ("workload", "dataset", "kind"),
    ("workload", "dataset", "path"),
    ("hyperparameters", "epochs"),
    ("hyperparameters", "maxSteps"),
    ("checkpoint", "intervalSteps"),
    ("checkpoint", "intervalMinutes"),
    ("reporting", "metricsPort"),
}
CROSS_FIELDS = [(path, schema) for path, schema in FIELDS if path in CROSS_FIELD]
assert len(CROSS_FIELDS) == len(CROSS_FIELD), "a cross-field path is not in the CRD any more"
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)


def value_for(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values that fit the field's schema, values just outside it, and values of the wrong type."""
    kind = schema.get("type")
    options: list[st.SearchStrategy[Any]] = [JSON]
    if kind in ("integer", "number"):
        low, high = schema.get("minimum", -(2**40)), schema.get("maximum", 2**40)
        options += [
            st.integers(int(low), int(high)),
            st.integers(int(low) - 3, int(low)),
            st.integers(int(high), int(high) + 3),
            st.integers(int(low), int(high)).map(str),  # a quoted number
            st.integers(int(low), int(high)).map(float),  # 2.0 where an integer is due
        ]
        if kind == "number":
            options.append(st.floats(float(low) - 1, float(high) + 1, allow_nan=False))
    elif kind == "string":
        options.append(st.text(max_size=20))
        # Well-typed values get through the apiserver to the operator: weigh them up.
        if "enum" in schema:
            options += [st.sampled_from(schema["enum"])] * 4
        if "pattern" in schema:
            options += [st.from_regex(schema["pattern"], fullmatch=True).filter(lambda s: len(s) < 64)] * 2
    elif kind == "boolean":
        options += [st.booleans(), st.sampled_from(["true", "false", "yes"])]
    elif kind == "object":
        options.append(st.dictionaries(st.text(max_size=12), st.text(max_size=12), max_size=3))
    return st.one_of(*options)


def _with(**changes: Any) -> dict[str, Any]:
    return factories.merge(factories.JOB_SPEC, changes)


def _with_null(*path: str) -> dict[str, Any]:
    spec = _with()
    parent = spec
    for key in path[:-1]:
        parent = parent.setdefault(key, {})
    parent[path[-1]] = None  # factories.merge reads None as "remove"; this is a literal null
    return spec


# Shapes where the two verdicts once differed or could: always run, whatever hypothesis draws.
PINNED = [
    _with(precision="fp16"),  # on CPU workers: a CEL rule now, as in the models
    _with(workload={"dataset": {"kind": "cifar10"}}),  # no path
    _with(workload={"dataset": {"kind": "tokens", "path": "t.bin"}}),  # the mlp on tokens: a CEL twin
    _with(workers={"replicas": "2"}),  # a quoted number: lax pydantic took it, the apiserver does not
    _with(network={"probe": "false"}),  # a quoted boolean
    _with(workers={"replicas": 2.0}),  # a whole number written as a float: both refuse it (per-field rule)
    _with(hyperparameters={"maxSteps": 1.0}),  # ... also where a cross-field rule reads it
    _with_null("checkpoint", "intervalMinutes"),  # null: the apiserver drops it and defaults it
    _with(reporting={"metricsPort": 8075}, workers={"gpusPerWorker": 8}),  # metrics ports over Ray's 8080
    _with(),
]


@st.composite
def mutated_spec(draw: st.DrawFn) -> dict[str, Any]:
    spec = copy.deepcopy(factories.JOB_SPEC)
    for _ in range(draw(st.integers(1, 3))):
        path, schema = draw(st.sampled_from(FIELDS) | st.sampled_from(CROSS_FIELDS))
        parent = spec
        for key in path[:-1]:
            if not isinstance(parent.get(key), dict):
                parent[key] = {}
            parent = parent[key]
        action = draw(st.sampled_from(["value", "value", "value", "delete", "unknown-key"]))
        if action == "delete":
            parent.pop(path[-1], None)
        elif action == "unknown-key":
            target = parent.setdefault(path[-1], {}) if schema.get("type") == "object" else parent
            if isinstance(target, dict):
                target[draw(st.sampled_from(["replica", "gpus", "extra", "nodeselector"]))] = draw(JSON)
        else:
            parent[path[-1]] = draw(value_for(schema))
    return spec


@pytest.fixture
def bad_input_operator(
    isolated_namespace: str, make_operator: Callable[..., operator_runner.Operator]
) -> operator_runner.Operator:
    operator = make_operator(isolated_namespace)
    operator.start()
    return operator


def test_the_apiserver_and_the_models_agree_on_any_manifest_and_the_operator_reconciles_the_admitted(
    isolated_plane: cluster.ControlPlane,
    isolated_namespace: str,
    bad_input_operator: operator_runner.Operator,
) -> None:
    api = Api(isolated_plane)
    ns = isolated_namespace
    outcomes = {"refused by both": 0, "admitted, valid": 0}
    counter = iter(range(1_000_000))

    @seed(property_seed.SEED)
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=False,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(st.lists(mutated_spec(), min_size=BATCH, max_size=BATCH), st.booleans())
    @example(PINNED, True)
    def apply_and_judge(specs: list[dict[str, Any]], strict: bool) -> None:
        admitted: dict[str, dict[str, Any]] = {}
        for spec in specs:
            name = f"bad-{next(counter)}"
            body = factories.manifest(name, ns)
            body["spec"] = spec
            models = _models_verdict(body)
            query = "?fieldValidation=Strict" if strict else ""
            try:
                stored = api.create(api.job(ns) + query, body)
            except ApiError as error:
                assert error.code in (400, 422), error  # refused as a bad request, not a server error
                if strict:
                    assert models, f"the apiserver refuses what trainop validate accepts: {spec}: {error}"
                outcomes["refused by both"] += 1
                continue
            if strict:
                assert not models, f"the apiserver admits what trainop validate refuses: {spec}: {models}"
            stored_verdict = _models_verdict(stored)
            assert not stored_verdict, (
                f"the apiserver stored a job the models refuse: {spec}: {stored_verdict}"
            )
            admitted[name] = spec
            outcomes["admitted, valid"] += 1
        settled = wait_settled(api, ns, admitted)
        for name, spec in admitted.items():
            conditions = {c["type"]: c for c in settled[name]["status"]["conditions"]}
            assert conditions["SpecValid"]["status"] == "True", (name, spec, conditions["SpecValid"])
            assert conditions["Failed"]["reason"] != "InvalidSpec", (name, spec)
        assert bad_input_operator.live(), "the operator's liveness probe failed"

    apply_and_judge()

    # No hot loop: timers the specs ask for (deadlines, TTLs, restart backoffs) fire and stop, and
    # retries back off; a loop does neither. So the counter must stand still for 6 s within 30 s, and
    # jobs take few reconciles each.
    deadline, last, quiet_since = time.monotonic() + 30, bad_input_operator.reconciles(), time.monotonic()
    while time.monotonic() - quiet_since < 6:
        assert time.monotonic() < deadline, "reconciles never stop after everything settled"
        time.sleep(1)
        now = bad_input_operator.reconciles()
        last, quiet_since = now, (quiet_since if now == last else time.monotonic())
    assert last <= 10 * outcomes["admitted, valid"], f"{last} reconciles for {outcomes} jobs"
    events = [e for e in api.list(f"/api/v1/namespaces/{ns}/events") if e["reason"] == "InvalidSpec"]
    assert events == []
    log = bad_input_operator.log()
    assert "Traceback" not in log, log[log.index("Traceback") - 2000 : log.index("Traceback") + 3000]
    assert bad_input_operator.running
    print(f"bad input outcomes: {outcomes}")
    assert outcomes["admitted, valid"] and outcomes["refused by both"], outcomes


def _models_verdict(body: dict[str, Any]) -> list[tuple[str, str]]:
    """The models' errors (path, message) for ``body``; empty when they accept it."""
    try:
        kinds.parse({**body, "metadata": {**body["metadata"], "uid": "u", "generation": 1}})
    except manifest.ManifestError as error:
        return [(e.path, e.message) for e in error.errors]
    return []


def wait_settled(
    api: Api, namespace: str, admitted: dict[str, Any], timeout_s: float = 60
) -> dict[str, dict[str, Any]]:
    """The admitted jobs once the operator has written a status for their current generation."""
    deadline = time.monotonic() + timeout_s
    while True:
        jobs = {
            j["metadata"]["name"]: j
            for j in api.list(api.job(namespace))
            if j["metadata"]["name"] in admitted
        }
        pending = [
            n
            for n, j in jobs.items()
            if (j.get("status") or {}).get("observedGeneration") != j["metadata"]["generation"]
            or not (j.get("status") or {}).get("conditions")
        ]
        if not pending and len(jobs) == len(admitted):
            return jobs
        assert time.monotonic() < deadline, f"not reconciled within {timeout_s}s: {pending}"
        time.sleep(0.2)


# Found by hypothesis (tests/security/test_pod_security_generated_specs.py): the API admitted tolerations
# that Kubernetes refuses in a pod, so KubeRay could not create the worker pods and the job sat in
# Provisioning. The CRD now refuses them at apply time, with the same rules as pod validation.
@pytest.mark.parametrize(
    ("toleration", "sentence"),
    [
        ({"operator": "Equal", "effect": "NoSchedule"}, "without a key must set operator: Exists"),
        ({"effect": "NoSchedule"}, "without a key must set operator: Exists"),
        ({"key": "gpu", "operator": "Exists", "value": "x"}, "operator Exists must not set a value"),
        ({"key": "gpu", "effect": "NoSchedule", "tolerationSeconds": 5}, "tolerationSeconds needs effect"),
    ],
)
def test_a_toleration_kubernetes_refuses_in_a_pod_is_refused_when_the_job_is_applied(
    isolated_plane: cluster.ControlPlane, isolated_namespace: str, toleration: dict[str, Any], sentence: str
) -> None:
    api = Api(isolated_plane)
    body = factories.manifest("bad-toleration", isolated_namespace)
    body["spec"] = _with(workers={"tolerations": [toleration]})
    with pytest.raises(ApiError) as refused:
        api.create(api.job(isolated_namespace), body)
    assert refused.value.code == 422
    assert "spec.workers.tolerations[0]" in str(refused.value) and sentence in str(refused.value)
    with pytest.raises(manifest.ManifestError, match=sentence):  # the models say the same
        kinds.parse({**body, "metadata": {**body["metadata"], "uid": "u", "generation": 1}})


# Found by hypothesis the same way: a nodeSelector key with two dots in its prefix ("a..0/0") was admitted,
# and Kubernetes refused the worker pods. Label keys and values (of nodeSelector and of tolerations) are now
# checked as pod validation checks them.
LONG_PREFIX = ".".join(["a" * 63] * 4) + "/gpu"  # a 255-character prefix: each label fine, the whole too long


@pytest.mark.parametrize(
    ("workers", "field", "sentence"),
    [
        ({"nodeSelector": {"a..0/0": ""}}, "spec.workers.nodeSelector", base.LABEL_KEY_HINT),
        ({"nodeSelector": {"-gpu": "x"}}, "spec.workers.nodeSelector", base.LABEL_KEY_HINT),
        ({"nodeSelector": {"gpu/" + "a" * 64: "x"}}, "spec.workers.nodeSelector", base.LABEL_KEY_HINT),
        ({"nodeSelector": {LONG_PREFIX: "x"}}, "spec.workers.nodeSelector", base.LABEL_KEY_PREFIX_TOO_LONG),
        ({"nodeSelector": {"gpu": "-a100"}}, "spec.workers.nodeSelector.gpu", None),
        (
            {"tolerations": [{"key": "a..b/gpu", "operator": "Exists"}]},
            "spec.workers.tolerations[0].key",
            None,
        ),
        ({"tolerations": [{"key": "gpu", "value": "a" * 64}]}, "spec.workers.tolerations[0].value", None),
    ],
    ids=[
        "two-dots",
        "leading-dash",
        "long-name",
        "long-prefix",
        "bad-value",
        "toleration-key",
        "toleration-value",
    ],
)
def test_a_label_kubernetes_refuses_in_a_pod_is_refused_when_the_job_is_applied(
    isolated_plane: cluster.ControlPlane,
    isolated_namespace: str,
    workers: dict[str, Any],
    field: str,
    sentence: str | None,
) -> None:
    """Refused by the apiserver (the field named; a CEL rule's own sentence where the CRD has one) and by the
    models, whose sentence names the fix (a pattern's hint where the apiserver can only quote the pattern)."""
    api = Api(isolated_plane)
    body = factories.manifest("bad-label", isolated_namespace)
    body["spec"] = _with(workers=workers)
    with pytest.raises(ApiError) as refused:
        api.create(api.job(isolated_namespace), body)
    assert refused.value.code == 422
    assert field in str(refused.value), str(refused.value)
    if sentence is not None:
        assert sentence in str(refused.value), str(refused.value)
    with pytest.raises(manifest.ManifestError) as models:
        kinds.parse({**body, "metadata": {**body["metadata"], "uid": "u", "generation": 1}})
    said = [e for e in models.value.errors if e.path.startswith(field)]
    assert said, models.value.errors
    assert any(
        (sentence or "") in e.message and ("label key" in e.message or "label value" in e.message)
        for e in said
    ), said


def test_the_tolerations_kubernetes_accepts_are_accepted(
    isolated_plane: cluster.ControlPlane, isolated_namespace: str
) -> None:
    api = Api(isolated_plane)
    body = factories.manifest("good-tolerations", isolated_namespace)
    tolerations = [
        {"operator": "Exists"},  # tolerates every taint
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "pool", "value": "a100", "effect": "NoExecute", "tolerationSeconds": 30},
        {"key": "", "operator": "Exists"},
    ]
    node_selector = {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "kubernetes.io/hostname": "node-1",
        "topology.kubernetes.io/zone": "",
        ".".join(["a" * 63] * 3) + "." + "a" * 61 + "/" + "A_b.c-D" * 9: "x" * 63,  # the longest key
    }
    body["spec"] = _with(workers={"tolerations": tolerations, "nodeSelector": node_selector})
    stored = api.create(api.job(isolated_namespace), body)
    parsed = kinds.parse(stored)
    assert len(parsed.spec.workers.tolerations) == 4
    assert parsed.spec.workers.node_selector == node_selector
