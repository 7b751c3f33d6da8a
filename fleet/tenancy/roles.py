"""The roles a person or a token holds in a tenant, in rising order of what they may do.

Plain values, apart from the models, so the querysets every model uses (fleet.tenancy.scoping)
can rank roles without importing the models they serve.
"""

from __future__ import annotations

from django.db import models


class Role(models.TextChoices):
    VIEWER = "viewer", "Viewer"
    DEPLOYER = "deployer", "Deployer"
    APPROVER = "approver", "Approver"
    ADMIN = "admin", "Admin"


RANK = {Role.VIEWER: 0, Role.DEPLOYER: 1, Role.APPROVER: 2, Role.ADMIN: 3}


def rank(role: str) -> int:
    """How much ``role`` may do: a higher rank may do all a lower one may."""
    return RANK[Role(role)]
