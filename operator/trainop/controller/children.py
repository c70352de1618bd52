"""Pure builders of an owner's children: ``desired_children(resource, attempt) -> list[manifest]``.

Every child has a deterministic name (``kinds.Kind``), the labels ``app.kubernetes.io/managed-by:
trainop`` and ``trainop.dev/job`` (``trainop.dev/sweep`` for sweeps), and an owner reference to the
TrainingJob/TuningSweep so that Kubernetes' garbage collector deletes it with its owner -- except the
checkpoint claim, which by default has no owner reference: checkpoints outlive the job, and a job created
again under the same name resumes from them. ``checkpoint.storage.deleteWithJob: true`` adds the
reference; ``existingClaim`` or ``s3`` (checkpoints in a bucket) means no claim is created at all.

The trainer's RBAC is as narrow as Kubernetes allows: its ServiceAccount may ``get`` and ``patch`` the
status subresource of its own owner (``resourceNames: [<name>]``) and ``create`` Events (a network
profile's outcome), nothing else -- not the spec, not other jobs, not Secrets. The RayJob is built in
``rayjob``.

This module must not talk to the API or read the clock: the same input gives the same manifests.
"""

from __future__ import annotations

from typing import Any

from trainop.api import base, manifest, trainer_config
from trainop.controller import kinds, meta, rayjob

Manifest = dict[str, Any]


def desired_pvc(resource: manifest.Resource) -> Manifest | None:
    """The checkpoint claim, or None when the spec names an existing one or keeps checkpoints in a bucket."""
    storage = kinds.training_spec(resource).checkpoint.storage
    name = kinds.claim_name(resource)
    if storage.existing_claim or name is None:
        return None
    spec: dict[str, Any] = {
        "accessModes": [storage.access_mode.value],
        "resources": {"requests": {"storage": storage.size}},
    }
    if storage.storage_class_name is not None:
        spec["storageClassName"] = storage.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": meta.object_metadata(resource, name, owned=storage.delete_with_job),
        "spec": spec,
    }


def desired_configmap(resource: manifest.Resource, attempt: int) -> Manifest:
    kind = kinds.kind_of(resource)
    metadata = meta.object_metadata(resource, kind.config_map_name(resource.metadata.name))
    metadata["annotations"] = {kinds.ANNOTATION_ATTEMPT: str(attempt)}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata,
        "data": {trainer_config.CONFIG_KEY: kinds.render_config(resource, attempt)},
    }


def desired_rbac(resource: manifest.Resource) -> list[Manifest]:
    """ServiceAccount + Role + RoleBinding: the trainer may get and patch its owner's status (the GET also
    shows it the owner's annotations: profile requests) and create Events (a profile's outcome), nothing
    else."""
    kind = kinds.kind_of(resource)
    name = resource.metadata.name
    account = kind.service_account_name(name)
    role = kind.role_name(name)
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": meta.object_metadata(resource, account),
            "automountServiceAccountToken": True,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta.object_metadata(resource, role),
            "rules": [
                {
                    "apiGroups": [base.GROUP],
                    "resources": [f"{kind.plural}/status"],
                    "resourceNames": [name],
                    "verbs": ["get", "patch"],
                },
                # Events about the job (a profile or communication report done); Kubernetes cannot narrow
                # create to one involved object, so this is namespace-wide, as the operator's own grant.
                {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta.object_metadata(resource, role),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
            "subjects": [
                {"kind": "ServiceAccount", "name": account, "namespace": resource.metadata.namespace}
            ],
        },
    ]


def desired_children(
    resource: manifest.Resource, attempt: int, *, include_ray_job: bool = True
) -> list[Manifest]:
    """Every child in creation order: claim, ConfigMap, RBAC, then the RayJob that needs all of them."""
    children: list[Manifest] = []
    claim = desired_pvc(resource)
    if claim is not None:
        children.append(claim)
    children.append(desired_configmap(resource, attempt))
    children.extend(desired_rbac(resource))
    if include_ray_job:
        children.append(rayjob.desired_rayjob(resource, attempt))
    return children
