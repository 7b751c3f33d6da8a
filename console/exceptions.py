"""Typed domain errors. One DRF exception handler (console.api) maps them to HTTP answers."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from django.core.exceptions import NON_FIELD_ERRORS, ValidationError


class DomainError(Exception):
    """A refusal the caller can act on. ``field`` names the input at fault, when there is one;
    ``also`` the other fields of the same request refused with it (:class:`FieldErrors`), so
    that one answer names every field to change."""

    status_code = 400

    def __init__(self, message: str, *, field: str | None = None,
                 also: dict[str, list[str]] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.also = {name: list(messages) for name, messages in (also or {}).items()}

    def by_field(self) -> dict[str | None, list[str]]:
        """Every message, by the field it is about (None: the request as a whole)."""
        found: dict[str | None, list[str]] = {self.field: [self.message]}
        for name, messages in self.also.items():
            found.setdefault(name, []).extend(m for m in messages if m not in found.get(name, []))
        return found

    def as_dict(self) -> dict[str, list[str]] | dict[str, str]:
        if self.field:
            return {str(name): messages for name, messages in self.by_field().items()}
        return {"detail": self.message}

    def renamed(self, rename: Callable[[str | None, str], tuple[str | None, str]]) -> DomainError:
        """The same refusal with each (field, message) as ``rename`` puts it (an API keys a
        nested path by the body's field, a form by its own field)."""
        given = [(name, message) for name, messages in self.by_field().items()
                 for message in messages]
        pairs = [rename(name, message) for name, message in given]
        if pairs == given:
            return self
        (field, message), rest = pairs[0], pairs[1:]
        also: dict[str, list[str]] = {}
        for name, text in rest:
            also.setdefault(str(name), []).append(text)
        kwargs: dict[str, Any] = {"field": field}
        if also:
            kwargs["also"] = also
        return type(self)(message, **kwargs)


class FieldErrors:
    """The refusals of a request's checks, gathered so that one answer names every field at
    fault rather than the first::

        errors = FieldErrors()
        with errors.gather():
            seconds = specs.duration_s(duration_s)
        ...
        errors.raise_any()

    A refusal of the input (a 400 naming a field) is kept and the block left; anything else
    (a Conflict with the state, a refusal of no field) is raised at once. Checks that need an
    earlier one's result run only when it passed (:meth:`refused`).
    """

    def __init__(self, given: Mapping[str, list[str]] | None = None) -> None:
        """``given``: refusals found before the domain's checks (an API body's shape, field
        by field); the domain's own refusals of those fields are then left out."""
        self.given = {name: list(messages) for name, messages in (given or {}).items()}
        self.found: list[DomainError] = []

    @contextmanager
    def gather(self) -> Iterator[None]:
        try:
            yield
        except DomainError as exc:
            if exc.status_code != 400 or not exc.field:
                raise
            if top_field(exc.field) not in self.given:
                self.found.append(exc)

    def refused(self, *fields: str) -> bool:
        """Whether any of ``fields`` (or a path under one) was refused."""
        return any(top_field(name) in fields for name in self.given) or any(
            top_field(name) in fields for exc in self.found for name in exc.by_field())

    def raise_any(self) -> None:
        """Raise what was gathered: the one refusal, or one naming every field."""
        if not self.found and not self.given:
            return
        if len(self.found) == 1 and not self.given:
            raise self.found[0]
        pairs = [(name, message) for name, messages in self.given.items() for message in messages]
        pairs += [(str(name), message) for exc in self.found
                  for name, messages in exc.by_field().items() for message in messages]
        (field, message), also = pairs[0], {}
        for name, text in pairs[1:]:
            also.setdefault(name, []).append(text)
        raise DomainError(message, field=field, also=also)


def top_field(path: str | None) -> str:
    """The field of a body a path names (``steps`` of ``steps[2].set_weight``)."""
    return str(path or "").split(".")[0].split("[")[0]


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
                 also: dict[str, list[str]] | None = None,
                 reclaimable: tuple = (), reclaim_policy: str = "") -> None:
        super().__init__(message, field=field, also=also)
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
