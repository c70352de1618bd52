"""What each pattern of the models means, in words a user can act on: one table for the models' errors
(``trainop validate``, the CR status) and the CRD's CEL rules on map keys (``kubectl apply``)."""

from __future__ import annotations

from trainop.api import base, trainingjob, tuningsweep

# Keyed by the pattern constants of the models.
PATTERN_HINTS: dict[str, str] = {
    base.DNS_LABEL_PATTERN: base.DNS_LABEL_HINT,
    base.QUANTITY_PATTERN: "must be a Kubernetes quantity such as 16Gi, 500Mi or 2",
    base.LABEL_KEY_PATTERN: base.LABEL_KEY_HINT,
    base.LABEL_VALUE_PATTERN: base.LABEL_VALUE_HINT,
    trainingjob.TOLERATION_KEY_PATTERN: "must be empty (with operator Exists) or "
    + base.LABEL_KEY_HINT.removeprefix("must be "),
    trainingjob.ENTRYPOINT_PATTERN: "must be 'pkg.module:function', e.g. mypkg.train:main",
    trainingjob.NCCL_ENV_KEY_PATTERN: "keys must be NCCL_*, TORCH_NCCL_*, UCX_* or FI_* variables",
    tuningsweep.PARAMETER_NAME_PATTERN: "keys must be dotted paths into the template "
    "(hyperparameters.learningRate) or nccl.NCCL_* variables",
    base.DNS_SUBDOMAIN_PATTERN: base.DNS_SUBDOMAIN_HINT,  # claims' and Secrets' names
    base.SECRET_KEY_PATTERN: "must be a key of the Secret: letters, digits, '-', '_' and '.'",
}


def key_rule_message(pattern: str) -> str:
    """The CRD's message for a map whose keys must match ``pattern``."""
    hint = PATTERN_HINTS.get(pattern)
    if hint is None:
        return f"every key must match {pattern}"
    return hint if hint.startswith("keys ") else f"every key {hint}"
