"""htmx requests from a session that has ended: answer 401 and send the whole page to login.

``login_required`` answers a redirect to the login page. htmx follows redirects inside the
XHR, so a polling partial would swap the login form into the middle of a page. Instead an
htmx request that would be sent to log in gets 401 with ``HX-Redirect``, which htmx turns into
a full navigation to the login page, coming back to the page the user was on.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from django.shortcuts import resolve_url


class HtmxLoginMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if (
            response.status_code == 302
            and getattr(request, "htmx", False)
            and not request.user.is_authenticated
            and urlsplit(response["Location"]).path == resolve_url(settings.LOGIN_URL)
        ):
            current = urlsplit(request.htmx.current_url or request.get_full_path())
            back = current.path + (f"?{current.query}" if current.query else "")
            answer = HttpResponse("Your session has ended: log in again.", status=401,
                                  content_type="text/plain")
            answer["HX-Redirect"] = redirect_to_login(back)["Location"]
            return answer
        return response
