"""The plugin's one way to the cluster: the ``kubectl`` binary, as the user would run it.

``Kubectl`` runs ``kubectl [--kubeconfig K] [--context C] [-n NS] <args>`` and hands back its output:
JSON objects for ``get``, text for ``logs`` and ``exec``, lines as they come for ``logs -f``. Which
binary: ``$TRAINOP_KUBECTL``, else ``kubectl`` on the PATH (kubectl runs its plugins with its own PATH).

Errors become ``KubectlError`` carrying kubectl's own message (``Error from server (Forbidden): ...``),
which the commands print as is: it already names the object and the missing permission. ``NotFound`` is
the one a caller branches on. This module must not decide anything about jobs.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator, Sequence
from typing import Any

KUBECTL_ENV = "TRAINOP_KUBECTL"
TIMEOUT_SECONDS = 120.0


class KubectlError(Exception):
    """kubectl failed; the message is kubectl's own last line (what a user would have seen)."""

    def __init__(self, message: str, *, returncode: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.returncode = returncode


class NotFound(KubectlError):
    pass


class Kubectl:
    def __init__(
        self,
        *,
        namespace: str | None = None,
        context: str | None = None,
        kubeconfig: str | None = None,
        binary: str | None = None,
    ) -> None:
        self.namespace = namespace
        self.binary = binary or os.environ.get(KUBECTL_ENV) or "kubectl"
        self._globals: list[str] = []
        if kubeconfig:
            self._globals += ["--kubeconfig", kubeconfig]
        if context:
            self._globals += ["--context", context]
        if namespace:
            self._globals += ["--namespace", namespace]

    def argv(self, args: Sequence[str]) -> list[str]:
        return [self.binary, *self._globals, *args]

    def run(self, *args: str, input: str | None = None, timeout: float = TIMEOUT_SECONDS) -> str:
        try:
            done = subprocess.run(
                self.argv(args), input=input, capture_output=True, text=True, timeout=timeout, check=False
            )
        except FileNotFoundError:
            raise KubectlError(
                f"kubectl not found ({self.binary}): install kubectl, or set {KUBECTL_ENV} to its path"
            ) from None
        except subprocess.TimeoutExpired:
            raise KubectlError(
                f"kubectl {' '.join(args[:2])} did not answer within {timeout:.0f} s"
            ) from None
        if done.returncode != 0:
            raise _error(done.stderr, done.returncode)
        return done.stdout

    # ------------------------------------------------------------------------------------------ verbs
    def get(self, resource: str, name: str) -> dict[str, Any] | None:
        """One object as JSON; None when it does not exist."""
        try:
            obj: dict[str, Any] = json.loads(self.run("get", resource, name, "--output", "json"))
        except NotFound:
            return None
        return obj

    def list(self, resource: str, *, selector: str) -> list[dict[str, Any]]:
        data = json.loads(self.run("get", resource, "--selector", selector, "--output", "json"))
        return list(data.get("items") or [])

    def merge_patch(self, resource: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        out = self.run(
            "patch", resource, name, "--type", "merge", "--patch", json.dumps(patch), "--output", "json"
        )
        result: dict[str, Any] = json.loads(out)
        return result

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(
            self.run("create", "--filename", "-", "--output", "json", input=json.dumps(obj))
        )
        return result

    def delete(self, resource: str, name: str) -> None:
        self.run("delete", resource, name, "--ignore-not-found", "--wait=false")

    def logs(self, pod: str, container: str, *, tail: int | None = None) -> str:
        return self.run("logs", pod, "--container", container, *_tail(tail))

    def follow_logs(self, pod: str, container: str, *, tail: int | None = None) -> Iterator[str]:
        """``kubectl logs -f``: lines as they come, until the container ends or the caller stops."""
        argv = self.argv(["logs", pod, "--container", container, "--follow", *_tail(tail)])
        try:
            process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        except FileNotFoundError:
            raise KubectlError(f"kubectl not found ({self.binary})") from None
        assert process.stdout is not None and process.stderr is not None
        try:
            yield from process.stdout
            if process.wait() != 0:
                raise _error(process.stderr.read(), process.returncode)
        finally:
            if process.poll() is None:
                process.terminate()
                process.wait()

    def exec(self, pod: str, container: str, command: Sequence[str]) -> str:
        return self.run("exec", pod, "--container", container, "--", *command)


def _tail(tail: int | None) -> list[str]:
    return [] if tail is None else ["--tail", str(tail)]


def _error(stderr: str, returncode: int) -> KubectlError:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    message = lines[-1] if lines else f"kubectl exited with code {returncode}"
    if "(NotFound)" in message or "NotFound" in message.split(":", 1)[0]:
        return NotFound(message, returncode=returncode)
    return KubectlError(message, returncode=returncode)
