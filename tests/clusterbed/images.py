"""The cluster bed's images beyond this repository's own: KubeRay's controller and CoreDNS.

The node agent pulls nothing; an image reference maps to files on this machine (``tests.nodeagent.images``
owns the format and this repository's trainer and operator images). Here: the two add-on images the bed's
manifests name, each pointing at the binary built from its Go module, at the path its real image has it.
"""

from __future__ import annotations

from typing import Any

from tests.clusterbed import assets

#: KubeRay's kustomize install names ``quay.io/kuberay/operator:<version>``; its Deployment runs ``/manager``.
KUBERAY_IMAGE = "quay.io/kuberay/operator"
#: addons/coredns.yaml; CoreDNS's image has ``ENTRYPOINT ["/coredns"]``.
COREDNS_IMAGE = "registry.k8s.io/coredns/coredns"


def image_map(*, extra: assets.BedAssets) -> dict[str, Any]:
    return {
        "images": {
            KUBERAY_IMAGE: {"paths": {"/manager": str(extra.kuberay_operator)}, "user": "65532"},
            COREDNS_IMAGE: {"entrypoint": ["/coredns"], "paths": {"/coredns": str(extra.coredns)}},
        }
    }
