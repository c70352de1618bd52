"""trainop: a Kubernetes operator for distributed PyTorch training on Ray.

Packages:
- ``trainop.api``: the API as pydantic models (the single source of truth) and what is derived from
  them: CRD schemas, manifest validation, the trainer's config.
- ``trainop.controller``: the kopf operator (pure builders + thin handlers).
- ``trainop.cli``: the one ``trainop`` command.

The trainer itself is the separate package ``trainop_trainer`` (trainer_image/), which imports only
``trainop.api``.
"""

__version__ = "0.1.0"
