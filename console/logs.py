"""Logging helpers named in ``LOGGING`` (console/settings.py): refusals in one line, and the
request id that follows a request into the Celery tasks it sends and the adapter calls they
make, with what each line is about (load, rollout, server).

``SWITCHYARD_LOG_FORMAT=json`` writes JSON lines (python-json-logger) with these as fields;
the default, plain text for the demo, appends them in brackets.
"""

from __future__ import annotations

import contextlib
import logging
import re
import uuid
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

from django.http import HttpRequest, HttpResponse


class RefusalsInOneLine(logging.Filter):
    """A request refused with a 4xx is logged as one line: what was refused and why.

    Django logs a ``PermissionDenied`` (and a bad request) with its traceback, as if the
    program had failed; a refusal is the program working. Its message says why instead
    ("… (this needs the deployer role in the tenant; you have viewer)"). Answers of 500 and
    above keep their traceback: those are the failures operators need to read.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        status = getattr(record, "status_code", None)
        if not isinstance(status, int) or not 400 <= status < 500 or not record.exc_info:
            return True
        exc = record.exc_info[1]
        message = record.getMessage()
        reason = str(exc) if exc is not None else ""
        if reason and reason not in message:
            message = f"{message} ({reason})"
        record.msg, record.args = message.replace("\n", " "), ()
        record.exc_info, record.exc_text = None, None
        return True


class TaskChatterAtDebug(logging.Filter):
    """Celery's line for every task received and every task that succeeded (and beat's for
    every task it sends) is DEBUG, not INFO: with ticks every second or two they would bury
    the lines that matter, one per state change of a load, rollout, benchmark or workload
    (rollouts.leases). Shown with ``SWITCHYARD_LOG_LEVEL=DEBUG`` (or ``-l debug``); a task
    that failed or retried keeps its level."""

    LOGGERS = ("celery.worker.strategy", "celery.app.trace", "celery.beat")
    CHATTER = ("Task %(name)s[%(id)s] received", "Task %(name)s[%(id)s] succeeded",
               "Scheduler: Sending due task")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO or not str(record.msg).startswith(self.CHATTER):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)

    @classmethod
    def install(cls) -> None:
        """Put the filter on Celery's loggers (once; the worker's and beat's import does)."""
        for name in cls.LOGGERS:
            logger = logging.getLogger(name)
            if not any(isinstance(f, cls) for f in logger.filters):
                logger.addFilter(cls())


# --------------------------------------------------------------------------------------------
# Request ids and what a log line is about
# --------------------------------------------------------------------------------------------

#: The id of the request being served, or of the request that sent the task being run.
REQUEST_ID: ContextVar[str] = ContextVar("switchyard_request_id", default="")
#: What the code running now works on (load, rollout, benchmark, server, ...), for every line.
SUBJECT: ContextVar[dict[str, Any]] = ContextVar("switchyard_log_subject", default={})
#: The header a request id travels in: a client's own (when it is a plain token), answered back.
HEADER = "X-Request-Id"
PLAIN_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
#: The Celery message header that carries the request id into the tasks a request sends.
TASK_HEADER = "switchyard_request_id"


def request_id_from(given: str | None) -> str:
    """The client's own id when it is a plain token (letters, digits, ``._:-``, up to 64),
    otherwise a new one: nothing a client sends reaches a log line unchecked."""
    if given and PLAIN_ID.fullmatch(given):
        return given
    return uuid.uuid4().hex


@contextlib.contextmanager
def about(**fields: Any) -> Iterator[None]:
    """Every line logged in the block names these too (``about(load=12, server="triton")``),
    beside what an enclosing block named."""
    token = SUBJECT.set({**SUBJECT.get(), **{k: v for k, v in fields.items() if v is not None}})
    try:
        yield
    finally:
        SUBJECT.reset(token)


@contextlib.contextmanager
def acting_for(request_id: str, **fields: Any) -> Iterator[None]:
    """Work on a row that a request asked for (a load, a rollout): the block logs under that
    request's id (kept on the row, so beat's reconcile ticks carry it too) and names the row."""
    token = REQUEST_ID.set(request_id) if request_id else None
    try:
        with about(**fields):
            yield
    finally:
        if token is not None:
            REQUEST_ID.reset(token)


class WithContext(logging.Filter):
    """Puts the request id and the subject on every record: as fields for the JSON format,
    and as ``context`` (" [request_id=… load=12]") for the plain one."""

    def filter(self, record: logging.LogRecord) -> bool:
        # Django logs a response's status (django.request) after the middleware returned: the
        # id is then read from the request the record carries.
        request_id = REQUEST_ID.get() or getattr(getattr(record, "request", None), "request_id", "")
        fields = {"request_id": request_id, **SUBJECT.get()}
        fields = {k: v for k, v in fields.items() if v not in ("", None)}
        for key, value in fields.items():
            if not hasattr(record, key):
                setattr(record, key, value)
        record.context = (" [" + " ".join(f"{k}={v}" for k, v in fields.items()) + "]") if fields else ""
        return True


class RequestIdMiddleware:
    """Gives each request an id (the client's ``X-Request-Id`` when plain, else a new one),
    logs under it, and answers it back in ``X-Request-Id``."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        request.request_id = request_id_from(request.headers.get(HEADER))
        token = REQUEST_ID.set(request.request_id)
        try:
            response = self.get_response(request)
        finally:
            REQUEST_ID.reset(token)
        response[HEADER] = request.request_id
        return response


def carry_into_task(headers: dict[str, Any] | None = None, **_: Any) -> None:
    """Celery ``before_task_publish``: the task's message carries the current request id."""
    if headers is not None and REQUEST_ID.get():
        headers.setdefault(TASK_HEADER, REQUEST_ID.get())


def adopt_in_task(task: Any = None, **_: Any) -> None:
    """Celery ``task_prerun``: the task logs under the id of the request that sent it (beat's
    ticks have none) and names itself."""
    request = getattr(task, "request", None)
    given = getattr(request, TASK_HEADER, None) or (getattr(request, "headers", None) or {}).get(TASK_HEADER)
    REQUEST_ID.set(given if isinstance(given, str) and PLAIN_ID.fullmatch(given) else "")
    SUBJECT.set({"task": getattr(task, "name", ""), "task_id": getattr(request, "id", "")})


def leave_task(**_: Any) -> None:
    """Celery ``task_postrun``: the worker's next task starts clean."""
    REQUEST_ID.set("")
    SUBJECT.set({})
