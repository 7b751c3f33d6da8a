"""Middleware that refuses hostile request input before any view or database sees it."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from django.http.multipartparser import MultiPartParserError

from console.errors import is_api, refuse

NUL = "\x00"


def _shown(name: str) -> str:
    return name.replace(NUL, "\\u0000")


def _nul_in(data: object) -> str | None:
    """The first parameter of a QueryDict whose name or a value holds a NUL character."""
    for key, values in data.lists():  # type: ignore[attr-defined]
        if NUL in key or any(NUL in value for value in values if isinstance(value, str)):
            return _shown(key)
    return None


class RefuseNulCharactersMiddleware:
    """A NUL character in the path, a header, a query parameter or a form field is a 400.

    No input of Switchyard may hold one, and PostgreSQL refuses them in text (a DataError, a
    500, wherever such a value reaches a query). Refused here once, for every view: the API
    answers ``{"<parameter>": ["NUL characters are not allowed"]}``, the console a page naming
    the parameter. API request bodies are checked by the API's parsers (``console.parsers``).
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        # A cookie holding one (the header itself may carry it quoted as \000) is ignored, as a
        # malformed cookie is: refusing would lock the browser out until the cookie expires.
        for name in [n for n, v in request.COOKIES.items() if NUL in n or NUL in v]:
            del request.COOKIES[name]
        problem = self._problem(request)
        if problem is not None:
            return problem
        return self.get_response(request)

    def _problem(self, request: HttpRequest) -> HttpResponse | None:
        message = "NUL characters are not allowed"
        if NUL in request.path:
            return refuse(request, 400, message, field="path")
        for key, value in request.META.items():
            if key.startswith("HTTP_") and key != "HTTP_COOKIE" and isinstance(value, str) and NUL in value:
                header = key.removeprefix("HTTP_").replace("_", "-").title()
                return refuse(request, 400, message, field=f"header {header}")
        name = _nul_in(request.GET)
        if name is not None:
            return refuse(request, 400, message, field=name)
        if request.method == "POST" and not is_api(request):
            try:
                name = _nul_in(request.POST)
            except MultiPartParserError as exc:
                return refuse(request, 400, f"malformed multipart body: {exc}")
            if name is not None:
                return refuse(request, 400, message, field=name)
        return None
