"""One DRF exception handler for the whole API.

Domain errors become 400/409 with the field named; Django ValidationErrors (from model
``full_clean``) become 400 with their field messages; PermissionDenied keeps its message.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import ProtectedError
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from fleet.errors import DomainError


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, DomainError):
        return Response(exc.as_dict(), status=exc.status_code)
    if isinstance(exc, DjangoValidationError):
        if hasattr(exc, "error_dict"):
            body: Any = exc.message_dict
        else:
            body = {"detail": exc.messages}
        return Response(body, status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, ProtectedError):
        users = sorted({str(obj) for obj in exc.protected_objects})
        shown = ", ".join(users[:5]) + (f" and {len(users) - 5} more" if len(users) > 5 else "")
        return Response(
            {"detail": f"still in use by {shown}: remove those first"},
            status=status.HTTP_409_CONFLICT,
        )
    if isinstance(exc, DjangoPermissionDenied):
        message = str(exc) or "you do not have permission to do this"
        exc = exceptions.PermissionDenied(message)
    return drf_exception_handler(exc, context)
