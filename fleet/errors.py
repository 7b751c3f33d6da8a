"""Typed domain errors. One DRF exception handler (console.api) maps them to HTTP answers."""

from __future__ import annotations


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
    """Admission refused: names the resource, what was asked and what is left."""

    status_code = 409
