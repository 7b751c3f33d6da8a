"""Typed domain errors. One DRF exception handler (console.api) maps them to HTTP answers."""

from __future__ import annotations

from django.core.exceptions import NON_FIELD_ERRORS, ValidationError


class DomainError(Exception):
    """A refusal the caller can act on. ``field`` names the input at fault, when there is one."""

    status_code = 400

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field

    def as_dict(self) -> dict[str, list[str]] | dict[str, str]:
        if self.field:
            return {self.field: [self.message]}
        return {"detail": self.message}


class Conflict(DomainError):
    """The request collides with the current state (already exists differently, wrong state)."""

    status_code = 409


class QuotaExceeded(DomainError):
    """Admission refused: names the resource, what was asked and what is left.

    ``reclaimable``: when the asker's own quota is lent to other tenants of its cohort, the
    borrowers' placements that would give it back, lowest priority first
    (fleet.quota.admission.Reclaimable); ``reclaim_policy`` is the cohort's (``list`` or ``unload``).
    """

    status_code = 409

    def __init__(self, message: str, *, field: str | None = None,
                 reclaimable: tuple = (), reclaim_policy: str = "") -> None:
        super().__init__(message, field=field)
        self.reclaimable = tuple(reclaimable)
        self.reclaim_policy = reclaim_policy


def messages_by_field(exc: ValidationError) -> dict[str, list[str]]:
    """A model's ValidationError as messages by field, the way the API and the console show
    them: a unique-together clash is put on its last field (the one the caller chose, e.g.
    ``name`` in (tenant, name)) instead of ``__all__``; errors of no field stay under
    ``NON_FIELD_ERRORS``."""
    if not hasattr(exc, "error_dict"):
        return {NON_FIELD_ERRORS: exc.messages}
    named: dict[str, list[str]] = {}
    for field, errors in exc.error_dict.items():
        for error in errors:
            key = field
            unique = error.code in ("unique", "unique_together")
            check = (error.params or {}).get("unique_check") if unique else None
            if field == NON_FIELD_ERRORS and check:
                key = check[-1]
            named.setdefault(key, []).extend(error.messages)
    return named
