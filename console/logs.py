"""Logging helpers named in ``LOGGING`` (console/settings.py)."""

from __future__ import annotations

import logging


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
