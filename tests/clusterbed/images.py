"""The cluster bed's images beyond this repository's own: KubeRay's controller, CoreDNS, a user's image.

The node agent pulls nothing; an image reference maps to files on this machine (``tests.nodeagent.images``
owns the format and this repository's trainer and operator images). Here: the two add-on images the bed's
manifests name, each pointing at the binary built from its Go module, at the path its real image has it;
and **a user's own image** (``USER_IMAGE``, ``example.com/ml-team/trainer-with-code:v1``): what
``e2e/usercode/Dockerfile`` builds -- ``FROM`` this checkout's trainer image, ``COPY`` of ``e2e/usercode/``
to ``/opt/ml-team/code``, ``ENV PYTHONPATH=/opt/ml-team/code``. Its entry is the trainer image's entry
of ``tests.nodeagent.images.default_images()`` (same venv, entrypoint, cmd, env, user, working directory)
plus a read-only ``paths`` mapping of that directory and the ``PYTHONPATH``, so a TrainingJob with this
image and ``workload.entrypoint: faulty_train:train`` imports user code in its Ray pods (the trainer
forwards ``PYTHONPATH`` to the Ray Train workers) that is in no package of the venv.
"""

from __future__ import annotations

from typing import Any

from tests.clusterbed import assets
from tests.nodeagent import images as nodeagent_images

#: KubeRay's kustomize install names ``quay.io/kuberay/operator:<version>``; its Deployment runs ``/manager``.
KUBERAY_IMAGE = "quay.io/kuberay/operator"
#: addons/coredns.yaml; CoreDNS's image has ``ENTRYPOINT ["/coredns"]``.
COREDNS_IMAGE = "registry.k8s.io/coredns/coredns"
#: A user's image: the trainer image with their code added (e2e/usercode/Dockerfile).
USER_IMAGE = "example.com/ml-team/trainer-with-code:v1"
#: Where e2e/usercode/Dockerfile copies the code, and the PYTHONPATH it sets.
USER_CODE_PATH = "/opt/ml-team/code"
USER_CODE_DIR = nodeagent_images.REPO_ROOT / "e2e" / "usercode"


def user_image() -> dict[str, Any]:
    """The image map entry of ``USER_IMAGE``: this checkout's trainer image + the user's code directory."""
    trainer = nodeagent_images.default_images().resolve(
        f"{nodeagent_images.TRAINER_REPOSITORY}:{nodeagent_images.IMAGE_TAG}"
    )
    entry: dict[str, Any] = {
        "entrypoint": list(trainer.entrypoint),
        "cmd": list(trainer.cmd),
        "env": {**dict(trainer.env), "PYTHONPATH": USER_CODE_PATH},
        "workingDir": trainer.working_dir,
        "user": trainer.user,
        "paths": {
            **{target: str(source) for target, source in trainer.paths},
            USER_CODE_PATH: str(USER_CODE_DIR),
        },
    }
    if trainer.bin_dir is not None:
        entry["bin"] = str(trainer.bin_dir)
    return entry


def image_map(*, extra: assets.BedAssets) -> dict[str, Any]:
    return {
        "images": {
            KUBERAY_IMAGE: {"paths": {"/manager": str(extra.kuberay_operator)}, "user": "65532"},
            COREDNS_IMAGE: {"entrypoint": ["/coredns"], "paths": {"/coredns": str(extra.coredns)}},
            USER_IMAGE: user_image(),
        }
    }
