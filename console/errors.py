"""Error answers from outside DRF: JSON in the API's error shape under /api/, pages elsewhere.

DRF answers the errors raised inside its views. These handlers (``handler400`` … ``handler500``
in ``console.urls``, and ``CSRF_FAILURE_VIEW``) answer the rest: an unknown /api/ path, a body
over ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (413), a request Django refuses as suspicious, an
unexpected exception. Under /api/ the answer is ``{"detail": "..."}`` (or
``{"<field>": ["..."]}`` when an input is named), like every other API error.
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views import defaults
from django.views.csrf import csrf_failure as django_csrf_failure

API_PREFIX = "/api/"


def is_api(request: HttpRequest) -> bool:
    return request.path_info.startswith(API_PREFIX)


def api_error(status: int, message: str, *, field: str | None = None) -> JsonResponse:
    body: dict[str, object] = {field: [message]} if field else {"detail": message}
    return JsonResponse(body, status=status)


def page_error(request: HttpRequest, status: int, message: str, title: str = "Bad request") -> HttpResponse:
    return render(request, "error.html", {"title": title, "message": message}, status=status)


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
    return defaults.bad_request(request, exception)


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
    return defaults.server_error(request)


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    if is_api(request):
        return api_error(403, f"CSRF Failed: {reason}")
    return django_csrf_failure(request, reason)
