"""The trainop API (group trainop.dev, version v1alpha1) as pydantic models.

Import modules, not names: ``from trainop.api import trainingjob`` then ``trainingjob.TrainingJob``.
Nothing here may import kopf, kubernetes, ray or torch: both images import this package.
"""

from trainop.api.base import API_VERSION, GROUP, VERSION

__all__ = ["API_VERSION", "GROUP", "VERSION"]
