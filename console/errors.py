"""Error answers from outside DRF: JSON in the API's error shape under /api/, pages elsewhere.

DRF answers the errors raised inside its views. These handlers (``handler400`` … ``handler500``
in ``console.urls``, and ``CSRF_FAILURE_VIEW``) answer the rest: an unknown /api/ path, a body
over ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (413), a request Django refuses as suspicious, an
unexpected exception. Under /api/ the answer is ``{"detail": "..."}`` (or
``{"<field>": ["..."]}`` when an input is named), like every other API error. Elsewhere it is
a console page (``error.html``, ``403.html``, ``404.html``); the 500 page stands alone
(``500.html``: no database, no context processors, no static files), since whatever failed
may be what a console page needs.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.template import loader
from django.views import defaults

API_PREFIX = "/api/"
logger = logging.getLogger(__name__)

# What the 500 page falls back to when even its template cannot be rendered.
BARE_500 = (
    '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Server error · Switchyard'
    '</title></head><body><h1>Server error</h1><p>Something went wrong on our side and it was '
    'logged for the operators. Try again in a moment.</p><p><a href="/">Dashboard</a></p>'
    '</body></html>'
)


def is_api(request: HttpRequest) -> bool:
    return request.path_info.startswith(API_PREFIX)


def api_error(status: int, message: str, *, field: str | None = None) -> JsonResponse:
    body: dict[str, object] = {field: [message]} if field else {"detail": message}
    return JsonResponse(body, status=status)


def page_error(request: HttpRequest, status: int, message: str, title: str = "Bad request",
               hint: str = "") -> HttpResponse:
    return render(request, "error.html", {"title": title, "message": message, "hint": hint},
                  status=status)


def refuse(request: HttpRequest, status: int, message: str, *, field: str | None = None) -> HttpResponse:
    """A refusal of the request's input: JSON naming ``field`` under /api/, a page elsewhere."""
    if is_api(request):
        return api_error(status, message, field=field)
    return page_error(request, status, f"{field}: {message}" if field else message)


def _bad_request_reason(exception: Exception | None) -> tuple[int, str]:
    if isinstance(exception, RequestDataTooBig):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return 413, f"the request body is larger than {limit} bytes"
    if isinstance(exception, TooManyFieldsSent):
        return 400, f"more than {settings.DATA_UPLOAD_MAX_NUMBER_FIELDS} form fields"
    if isinstance(exception, TooManyFilesSent):
        return 400, f"more than {settings.DATA_UPLOAD_MAX_NUMBER_FILES} files"
    return 400, "bad request"


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    status, message = _bad_request_reason(exception)
    if is_api(request):
        return api_error(status, message)
    if status != 400 or message != "bad request":
        return page_error(request, status, message)
    return page_error(request, 400, "The request could not be read.",
                      hint="Go back and try again")


def permission_denied(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if is_api(request):
        return api_error(403, str(exception or "") or "you do not have permission to do this")
    return defaults.permission_denied(request, exception)


def page_not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if is_api(request):
        return api_error(404, f"Not found: no API endpoint at {request.path}")
    return defaults.page_not_found(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    if is_api(request):
        return api_error(500, "internal server error: the error was logged for the operators")
    try:
        # Rendered without the request: no context processor (the database, the session)
        # runs, so a page that failed for one of them still gets this one.
        body = loader.get_template("500.html").render()
    except Exception:
        logger.exception("the 500 page could not be rendered; answering a bare one")
        body = BARE_500
    return HttpResponse(body, status=500)


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    if is_api(request):
        return api_error(403, f"CSRF Failed: {reason}")
    return page_error(
        request, 403, "The form could not be checked: it came without this site's CSRF cookie "
        "or token, or from a page opened before you logged in again.", title="Not allowed",
        hint="Reload the page (cookies must be allowed for this site) and submit it again",
    )
