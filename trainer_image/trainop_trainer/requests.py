"""Requests a user makes of a running job: a profile window, a communication report (rank 0 only).

Sources, polled on a background thread every few seconds (never on the training thread):

- **the job's own annotations** (``trainop.dev/profile=<steps>``, ``trainop.dev/communication-report=<any
  value>``): rank 0 reads its TrainingJob through the status subresource, which the job's service account
  may already ``get`` (a GET of ``/status`` returns the whole object, metadata included), so the operator
  needs to forward nothing;
- **files in the run directory** (local mode, or by hand on the volume): ``trainop/profile-request``
  holding the annotation's value, ``trainop/communication-report-request`` holding any value.

A request is a value. It is new when it differs from the last value handled for that kind; the handled
values are kept in ``trainop/requests-handled.json`` on the volume, so a restart or a new attempt does
not profile again. To ask again with the same number of steps, give another value: ``20:again`` (what
follows a ``:`` is free). A value that is not a number of steps from 1 to ``MAX_PROFILE_STEPS`` fails the
request with one sentence on ``status.profile``.

``StepSchedule.poll`` calls ``post()`` once per step on rank 0 (a dictionary read); the decision reaches
every rank through the control channel; ``profiling.Profiler`` acts on it and calls ``done`` here.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pathlib
import threading
from typing import Any

from trainop.api import experiment, trainer_config

log = logging.getLogger(__name__)

PROFILE = "profile"
COMMUNICATION = "communication"
POLL_INTERVAL_S = 5.0
HANDLED_FILE = "requests-handled.json"
_FILES = {PROFILE: "profile-request", COMMUNICATION: "communication-report-request"}
_ANNOTATIONS = {
    PROFILE: experiment.PROFILE_ANNOTATION,
    COMMUNICATION: experiment.COMMUNICATION_REPORT_ANNOTATION,
}


class InvalidRequest(ValueError):
    """A request value the trainer cannot act on (one sentence naming the annotation and the fix)."""


def profile_steps(value: str) -> int:
    """The number of steps in a ``trainop.dev/profile`` value (``20`` or ``20:anything``)."""
    head = value.split(":", 1)[0].strip()
    try:
        steps = int(head)
    except ValueError:
        steps = 0
    if not 1 <= steps <= experiment.MAX_PROFILE_STEPS:
        raise InvalidRequest(
            f"annotation {experiment.PROFILE_ANNOTATION}={value!r} must be a number of steps from 1 to "
            f"{experiment.MAX_PROFILE_STEPS} (optionally followed by ':' and any text to ask again), e.g. "
            f"{experiment.PROFILE_ANNOTATION}=20"
        )
    return steps


@dataclasses.dataclass(frozen=True)
class Request:
    kind: str
    value: str


class RequestWatcher:
    """Rank 0's view of what users asked for; ``post`` hands the training loop at most one new request of
    each kind, once."""

    def __init__(
        self,
        *,
        run_dir: pathlib.Path,
        target: trainer_config.StatusTarget | None,
        api: Any = None,
        poll_interval_s: float = POLL_INTERVAL_S,
    ) -> None:
        self._dir = run_dir / "trainop"
        self._target = target
        self._api = api
        self._interval = poll_interval_s
        self._lock = threading.Lock()
        self._seen: dict[str, str] = {}  # the newest value of each kind
        self._handled = self._read_handled()
        self._claimed: dict[str, Request] = {}
        self.invalid: list[tuple[Request, str]] = []  # failed requests for the profiler to report
        self.object: dict[str, Any] | None = None  # the job as last read (for Events: uid, namespace)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="requests", daemon=True)

    def start(self) -> RequestWatcher:
        self.poll_once()
        self._thread.start()
        return self

    # ------------------------------------------------------------------------------------------ reading
    def _read_handled(self) -> dict[str, str]:
        try:
            data = json.loads((self._dir / HANDLED_FILE).read_text())
        except (OSError, ValueError):
            return {}
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}

    def _from_files(self) -> dict[str, str]:
        found = {}
        for kind, name in _FILES.items():
            try:
                value = (self._dir / name).read_text().strip()
            except OSError:
                continue
            if value:
                found[kind] = value
        return found

    def _from_object(self) -> dict[str, str]:
        if self._target is None:
            return {}
        if self._api is None:
            from trainop_trainer import status

            self._api = status._kube_api()
        target = self._target
        obj: dict[str, Any] = self._api.get_namespaced_custom_object_status(
            group=target.group,
            version=target.version,
            namespace=target.namespace,
            plural=target.plural,
            name=target.name,
            _request_timeout=10,
        )
        self.object = obj
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        return {kind: str(annotations[key]) for kind, key in _ANNOTATIONS.items() if annotations.get(key)}

    def poll_once(self) -> None:
        found = self._from_files()
        try:
            found.update(self._from_object())
        except Exception as exc:
            log.warning(
                "reading the annotations of %s failed (%s); profile requests wait for the next try",
                self._target.name if self._target else "?",
                str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
            )
        with self._lock:
            self._seen = found

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.poll_once()

    # ---------------------------------------------------------------------------------- the loop's side
    def _new(self, kind: str) -> Request | None:
        value = self._seen.get(kind)
        if value is None or value == self._handled.get(kind) or kind in self._claimed:
            return None
        return Request(kind=kind, value=value)

    def post(self) -> tuple[int, bool]:
        """Rank 0, once per step: the profile steps and the communication flag to ask every rank for."""
        with self._lock:
            steps = 0
            profile = self._new(PROFILE)
            if profile is not None:
                try:
                    steps = profile_steps(profile.value)
                    self._claimed[PROFILE] = profile
                except InvalidRequest as exc:
                    self.invalid.append((profile, str(exc)))
                    self._mark_handled(profile)
            communication = self._new(COMMUNICATION)
            if communication is not None:
                self._claimed[COMMUNICATION] = communication
            return steps, communication is not None

    def claimed(self, kind: str) -> Request | None:
        with self._lock:
            return self._claimed.get(kind)

    def done(self, kind: str) -> None:
        """The claimed request of ``kind`` was acted on (completed or failed): never again."""
        with self._lock:
            request = self._claimed.pop(kind, None)
            if request is not None:
                self._mark_handled(request)

    def _mark_handled(self, request: Request) -> None:
        self._handled[request.kind] = request.value
        try:
            self._dir.mkdir(parents=True, exist_ok=True)
            (self._dir / HANDLED_FILE).write_text(json.dumps(self._handled, sort_keys=True))
        except OSError as exc:
            log.warning("could not record the handled request (%s); a restart may act on it again", exc)

    def close(self) -> None:
        self._stop.set()
