"""FAKE of the kube-apiserver for the reconcile unit tier: an in-memory store behind ``kube.Kube``'s verbs.

It is a mock, declared as such: the unit tier tests the *order and number* of the requests a reconcile
makes (the write-order and crash-safety contract) in milliseconds, which the apiserver tier
(tests/operator/integration) cannot do cheaply. It replaces exactly ``kube.Kube.request`` -- the one
method that speaks HTTP -- so the operator's own verbs (``get``, ``create``, ``patch``, ``apply``,
``delete``) run unchanged on top of it. What it does:

- stores objects by path, with uid, resourceVersion (one counter for all, as etcd's revision),
  creationTimestamp; 404 on a missing object, 409 on creating an existing one, a uid precondition on delete;
- JSON merge patches (RFC 7386), refused (422) when they change ``metadata.uid`` as the apiserver refuses
  a change of an immutable field; JSON patches (RFC 6902: test, add, remove, replace), refused (422)
  as a whole when one operation fails; of a patch of the status subresource only ``status`` is kept, as
  the apiserver keeps it; server-side apply approximated as a deep merge of the applied object (enough
  for the operator's applies, which always send the whole desired object);
- ``fail_on``: answers a chosen request with an error, to cut a reconcile at a chosen point (a crash);
- records every request as ``(verb, what)`` in ``requests``, e.g. ``("create", "RayJob mlp-a1")``, and
  when it was in flight (``spans``): every request yields to the event loop once before it is served, as
  one sent over HTTP does, so requests a reconcile issues concurrently are in flight together, and
  :meth:`FakeKube.before` and :meth:`FakeKube.round_trips` tell what waited for what.

What it does not do: validation, admission, defaulting, RBAC, watches (``Watches.sync`` plays the watch:
it re-runs the cache's kopf index functions over the store, as kopf does on events).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import datetime
import itertools
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from trainop.controller import cache, kube

KINDS = {
    "configmaps": "ConfigMap",
    "persistentvolumeclaims": "PersistentVolumeClaim",
    "pods": "Pod",
    "serviceaccounts": "ServiceAccount",
    "events": "Event",
    "roles": "Role",
    "rolebindings": "RoleBinding",
    "rayjobs": "RayJob",
    "rayclusters": "RayCluster",
    "trainingjobs": "TrainingJob",
    "tuningsweeps": "TuningSweep",
}


@dataclasses.dataclass(frozen=True)
class Request:
    verb: str  # get | list | create | patch | patch-status | apply | delete
    kind: str
    name: str

    def __str__(self) -> str:
        return f"{self.verb} {self.kind} {self.name}".rstrip()


@dataclasses.dataclass(frozen=True)
class Span:
    """When a request was in flight, counted in completed requests: it was sent once ``issued`` requests
    had been answered, and its own answer was number ``done``."""

    request: Request
    issued: int
    done: int


def json_patch(target: dict[str, Any], operations: list[Mapping[str, Any]]) -> dict[str, Any]:
    """RFC 6902 (test, add, remove, replace); a failed operation raises what the apiserver answers."""
    out = copy.deepcopy(target)
    for operation in operations:
        *parents, last = [
            token.replace("~1", "/").replace("~0", "~") for token in operation["path"].split("/")[1:]
        ]
        node: Any = out
        for token in parents:
            node = node.get(token) if isinstance(node, dict) else None
        present = isinstance(node, dict) and last in node
        op, value = operation["op"], operation.get("value")
        if op == "test":
            ok = node[last] == value if present else value is None
        elif op == "add":
            ok = isinstance(node, dict)
            if ok:
                node[last] = copy.deepcopy(value)
        elif op in ("remove", "replace"):
            ok = present
            if ok and op == "remove":
                del node[last]
            elif ok:
                node[last] = copy.deepcopy(value)
        else:
            raise AssertionError(f"the fake serves no JSON patch {op!r}")
        if not ok:
            raise kube.ApiError(
                422, "Invalid", "the server rejected our request due to an error in our request"
            )
    return out


def merge(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge(out.get(key), value)
    return out


class FakeKube(kube.Kube):
    def __init__(self) -> None:
        super().__init__(api_client=None)  # type: ignore[arg-type]
        self.objects: dict[str, dict[str, Any]] = {}  # collection path + "/" + name -> object
        self.requests: list[Request] = []
        self.spans: list[Span] = []
        self.fail_on: Callable[[Request], kube.ApiError | None] = lambda _: None
        self._versions = itertools.count(100)
        self._answered = 0

    # ------------------------------------------------------------------------------- what tests use
    def put(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Store an object as someone else (a user, KubeRay) made it; no request is recorded."""
        meta = obj["metadata"]
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", "2026-03-01T11:00:00Z")
        meta["resourceVersion"] = str(next(self._versions))
        self.objects[self._path_of(obj)] = obj
        return obj

    def get_object(self, kind: str, name: str) -> dict[str, Any] | None:
        for obj in self.objects.values():
            if obj["kind"] == kind and obj["metadata"]["name"] == name:
                return obj
        return None

    def writes(self) -> list[str]:
        return [str(r) for r in self.requests if r.verb not in ("get", "list")]

    def clear(self) -> None:
        self.requests.clear()
        self.spans.clear()

    def _span(self, request: str) -> Span:
        found = [span for span in self.spans if str(span.request) == request]
        assert len(found) == 1, f"{request!r} was sent {len(found)} times: {[str(r) for r in self.requests]}"
        return found[0]

    def before(self, first: str, then: str) -> bool:
        """Whether request ``first`` was answered before request ``then`` was sent."""
        return self._span(first).done <= self._span(then).issued

    def round_trips(self) -> int:
        """The longest chain of requests each sent only after the previous one was answered."""
        depth: dict[int, int] = {}
        for index, span in enumerate(self.spans):
            waited = [depth[i] for i, other in enumerate(self.spans[:index]) if other.done <= span.issued]
            depth[index] = 1 + max(waited, default=0)
        return max(depth.values(), default=0)

    # ------------------------------------------------------------------------------- the one seam
    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        parts = path.strip("/").split("/")
        namespaced = parts.index("namespaces")
        collection = "/".join(parts[: namespaced + 3])
        plural = parts[namespaced + 2]
        name = (
            parts[namespaced + 3]
            if len(parts) > namespaced + 3
            else (body or {}).get("metadata", {}).get("name", "")
        )
        subresource = parts[namespaced + 4] if len(parts) > namespaced + 4 else None
        verb = {
            "GET": "get",
            "POST": "create",
            "DELETE": "delete",
            "PATCH": "apply" if content_type == "application/apply-patch+yaml" else "patch",
        }[method]
        if verb == "patch" and subresource == "status":
            verb = "patch-status"
        request = Request(verb, KINDS[plural], str(name))
        self.requests.append(request)
        issued = self._answered
        await asyncio.sleep(0)  # in flight: what was sent together is answered together
        try:
            return self._serve(request, parts, namespaced, collection, plural, name, subresource, body)
        finally:
            self._answered += 1
            self.spans.append(Span(request, issued, self._answered))

    def _serve(
        self,
        request: Request,
        parts: list[str],
        namespaced: int,
        collection: str,
        plural: str,
        name: str,
        subresource: str | None,
        body: Any,
    ) -> dict[str, Any]:
        verb = request.verb
        error = self.fail_on(request)
        if error is not None:
            raise error
        key = f"{collection}/{name}"
        stored = self.objects.get(key)
        if verb == "get":
            if stored is None:
                raise kube.ApiError(404, "NotFound", f"{plural} {name!r} not found")
            return copy.deepcopy(stored)
        if verb == "create":
            if stored is not None:
                raise kube.ApiError(409, "AlreadyExists", f"{plural} {name!r} already exists")
            obj = copy.deepcopy(dict(body))
            obj.setdefault("metadata", {}).setdefault("namespace", parts[namespaced + 1])
            return copy.deepcopy(self.put(obj))
        if verb == "delete":
            if stored is None:
                raise kube.ApiError(404, "NotFound", f"{plural} {name!r} not found")
            wanted = ((body or {}).get("preconditions") or {}).get("uid")
            if wanted and wanted != stored["metadata"]["uid"]:
                raise kube.ApiError(409, "Conflict", "Precondition failed: UID in precondition")
            del self.objects[key]
            return {}
        if stored is None and verb != "apply":
            raise kube.ApiError(404, "NotFound", f"{plural} {name!r} not found")
        if isinstance(body, list):  # a JSON patch, of the whole object as stored
            assert stored is not None
            patched = json_patch(stored, body)
            obj = patched if subresource != "status" else {**stored, "status": patched.get("status")}
        else:
            uid = (body.get("metadata") or {}).get("uid")
            if (
                subresource != "status"
                and verb == "patch"
                and uid
                and stored
                and uid != stored["metadata"]["uid"]
            ):
                raise kube.ApiError(
                    422, "Invalid", f"{plural} {name!r} is invalid: metadata.uid: field is immutable"
                )
            patch = body if verb == "apply" or subresource != "status" else {"status": body["status"]}
            obj = merge(stored or {}, patch)
        obj.setdefault("metadata", {}).setdefault("namespace", parts[namespaced + 1])
        return copy.deepcopy(self.put(obj))

    @staticmethod
    def _path_of(obj: Mapping[str, Any]) -> str:
        resource = kube.BY_KIND.get(obj["kind"]) or kube.Resource(
            obj["apiVersion"], obj["kind"].lower() + "s"
        )
        return f"{resource.path(obj['metadata']['namespace'])}/{obj['metadata']['name']}".strip("/")


class Watches:
    """Plays kopf's watches over a ``FakeKube``: ``sync()`` delivers everything that changed since the last
    one -- into the cache's kopf index functions, as kopf does, and as events to ``deliver`` (the engine's
    routing, which also tells ``own_writes`` which changes were not the operator's own)."""

    INDEXED = {
        "RayJob": (cache.RAY_JOBS, cache.index_ray_job),
        "RayCluster": (cache.RAY_CLUSTERS, cache.index_ray_cluster),
        "PersistentVolumeClaim": (cache.CLAIMS, cache.index_claim),
        "Pod": (cache.PODS, cache.index_pod),
        "TrainingJob": (cache.OWNERS_BY_CLAIM, cache.index_owner_claims),
        "TuningSweep": (cache.OWNERS_BY_CLAIM, cache.index_owner_claims),
    }
    WATCHED = {
        "RayJob",
        "RayCluster",
        "PersistentVolumeClaim",
        "Pod",
        "ServiceAccount",
        "Role",
        "RoleBinding",
    }

    def __init__(self, fake: FakeKube) -> None:
        self._fake = fake
        self._indexes: dict[str, dict[Any, list[Any]]] = {index_id: {} for index_id in cache.INDEX_IDS}
        self.cache = cache.Cache(self._indexes)
        self.deliver: Callable[[dict[str, Any], bool], None] | None = None
        self._seen: dict[str, tuple[str, dict[str, Any]]] = {}  # path -> (resourceVersion, object)

    def sync(self) -> None:
        for index in self._indexes.values():
            index.clear()
        for obj in self._fake.objects.values():
            indexed = self.INDEXED.get(obj["kind"])
            if indexed is not None:
                for key, value in (indexed[1](obj) or {}).items():
                    self._indexes[indexed[0]].setdefault(key, []).append(value)
        if self.deliver is None:
            return
        current = {path: obj for path, obj in self._fake.objects.items() if obj["kind"] in self.WATCHED}
        for path, obj in current.items():
            if self._seen.get(path, ("",))[0] != obj["metadata"]["resourceVersion"]:
                self.deliver(copy.deepcopy(obj), False)
        for path, (_, obj) in self._seen.items():
            if path not in current:
                self.deliver(obj, True)
        self._seen = {
            path: (obj["metadata"]["resourceVersion"], copy.deepcopy(obj)) for path, obj in current.items()
        }


def utc(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
