"""Template context shared by every console page."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest

from fleet.tenancy.scoping import is_platform_admin


def switchyard(request: HttpRequest) -> dict[str, object]:
    return {
        "is_platform_admin": is_platform_admin(getattr(request, "user", None)),
        "demo_hint": settings.SWITCHYARD_DEMO_PASSWORD,
    }
