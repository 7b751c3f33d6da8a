"""Idempotent creation: a request sent again with its Idempotency-Key answers with what the
first one made, and with nothing new.

Every job request (model loads, rollouts, benchmark jobs, the servers Switchyard runs on
Kubernetes) follows the same three rules, written once here:

* :func:`fingerprint`: what a request asked for, as a hash of its fields (rows by primary
  key), kept with what it made;
* :func:`check_replay`: under the request's own locks, an earlier request with the same key
  is answered again when it asked for the same thing, and is a 409 on ``idempotency_key``
  when it asked for another;
* :func:`create_once`: when two requests race past those checks, the database's unique
  constraint decides; the loser answers as the winner's replay (same key and request), or
  with the caller's own refusal (another request took the name, the server, the deployment).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import IntegrityError

from console.exceptions import Conflict

T = TypeVar("T")


def fingerprint(**request: Any) -> str:
    """The request's fields as sorted JSON, rows by primary key, hashed (SHA-256)."""
    plain = {name: getattr(value, "pk", value) for name, value in request.items()}
    return hashlib.sha256(json.dumps(plain, sort_keys=True, default=str).encode()).hexdigest()


def check_replay(earlier_fingerprint: str | None, fingerprint: str) -> None:
    """An Idempotency-Key answers again only the request it was first used for: a Conflict
    on ``idempotency_key`` when that earlier request (``earlier_fingerprint``) was another."""
    if earlier_fingerprint != fingerprint:
        raise Conflict("this Idempotency-Key was used for a different request",
                       field="idempotency_key")


def create_once(
    create: Callable[[], tuple[T, bool]],
    *,
    key: str,
    replay: Callable[[], T | None],
    refuse: Callable[[], None] | None = None,
) -> tuple[T, bool]:
    """``create()`` (which checks, under its locks, for an earlier request with ``key`` and
    returns ``(what it made or found, whether it made anything)``); should its insert lose a
    race all the same (an IntegrityError from a unique constraint), the earlier request with
    ``key`` answers (``replay()``, which calls :func:`check_replay`), else ``refuse()`` raises
    the caller's Conflict, else the error stands."""
    try:
        return create()
    except IntegrityError:
        if key:
            earlier = replay()
            if earlier is not None:
                return earlier, False
        if refuse is not None:
            refuse()
        raise
