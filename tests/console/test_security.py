"""Console security: token secrets shown once and never stored, the token form's refusals,
brute-force lockout of logins and token use, the Content-Security-Policy and proxy headers."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import time_machine
from django.contrib.sessions.models import Session
from django.test import Client
from django.utils import timezone
from drf_spectacular.generators import SchemaGenerator
from playwright.sync_api import Browser, Dialog, expect
from rest_framework.test import APIClient

from fleet.models import APIToken, AuditEvent
from fleet.tenancy import tokens
from fleet.tenancy.forms import TokenForm
from rollouts.models import ModelLoad
from tests.console.test_tenancy_matrix import PAGES as MATRIX_PAGES
from tests.console.test_tenancy_matrix import PLATFORM
from tests.console.test_tenancy_matrix import World as MatrixWorld
from tests.factories import (
    ClusterFactory,
    DeploymentFactory,
    InferenceServerFactory,
    ModelFactory,
    ModelVersionFactory,
)

SECRET_RE = re.compile(r"sy_[0-9a-f]{8}_[A-Za-z0-9_-]{20,}")


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


# --- a new token's secret: shown once, from memory ------------------------------------------


def test_a_new_tokens_secret_is_shown_once_and_never_stored_in_the_session(client, alice):
    client.force_login(alice)

    created = client.post(
        "/fleet/tokens/new/", {"tenant": "tenant-a", "name": "ci", "role": "deployer"}
    )

    assert created.status_code == 200
    page = created.content.decode()
    [secret] = SECRET_RE.findall(page)
    assert page.count(secret) == 1
    assert "no-store" in created["Cache-Control"]
    token = APIToken.objects.get(name="ci")
    assert secret.startswith(f"sy_{token.prefix}_")
    random_part = secret.split("_", 2)[2]
    for row in Session.objects.all():
        assert random_part not in row.session_data
        assert random_part not in repr(row.get_decoded())
    assert random_part not in repr(dict(client.session))
    assert not any(random_part in str(v) for v in APIToken.objects.values().get(pk=token.pk).values())
    again = client.get("/fleet/tokens/")
    assert random_part not in again.content.decode()
    assert "sy_" + token.prefix in again.content.decode()


def test_a_token_made_on_the_console_records_its_person(client, alice):
    client.force_login(alice)

    client.post("/fleet/tokens/new/", {"tenant": "tenant-a", "name": "ci", "role": "admin"})

    assert APIToken.objects.get(name="ci").created_by == alice


def test_an_impossible_expiry_is_a_400_naming_expires_at(client, alice):
    client.force_login(alice)

    response = client.post(
        "/fleet/tokens/new/",
        {"tenant": "tenant-a", "name": "ci", "role": "deployer", "expires_at": "2026-13-45T00:00"},
    )

    assert response.status_code == 400
    assert 'id="expires_at-error"' in response.content.decode()
    assert "enter a date and time" in response.content.decode()
    assert not APIToken.objects.exists()


def test_an_expiry_in_the_past_is_refused_on_expires_at_by_the_domain(client, alice):
    client.force_login(alice)

    response = client.post(
        "/fleet/tokens/new/",
        {"tenant": "tenant-a", "name": "ci", "role": "deployer", "expires_at": "2001-01-01T00:00"},
    )

    assert response.status_code == 409
    assert "expiry must be in the future" in response.content.decode()
    assert not APIToken.objects.exists()


@pytest.mark.parametrize("field", ["name", "tenant", "role"])
def test_a_nul_character_in_the_token_form_is_a_form_error(alice, tenant_a, field):
    data = {"tenant": "tenant-a", "name": "ci", "role": "deployer"} | {field: "ci\x00x"}

    form = TokenForm(data, actor=alice)

    assert form.save() is None
    assert field in form.errors
    assert not APIToken.objects.exists()


def test_another_tenants_slug_is_a_form_error_on_tenant(client, alice, tenant_b):
    client.force_login(alice)

    response = client.post(
        "/fleet/tokens/new/", {"tenant": "tenant-b", "name": "ci", "role": "deployer"}
    )

    assert response.status_code == 400
    assert "not one of your tenants" in response.content.decode()
    assert not APIToken.objects.exists()


def test_a_viewer_cannot_make_a_token_on_the_console(client, bob):
    client.force_login(bob)

    response = client.post(
        "/fleet/tokens/new/", {"tenant": "tenant-a", "name": "ci", "role": "deployer"}
    )

    assert response.status_code == 403
    assert not APIToken.objects.exists()


# --- brute force: logins on the console and in the admin (django-axes) --------------------------

LOGIN_LIMIT = 3
COOLOFF = timedelta(minutes=5)
RIGHT = "pw-for-tests-1"  # tests.factories.UserFactory
WRONG = "not-the-password"


@pytest.fixture
def lockout_limits(settings):
    """Low limits for the tests. django-axes and fleet.tenancy.lockouts read these at call time."""
    settings.SWITCHYARD_LOGIN_FAILURE_LIMIT = LOGIN_LIMIT
    settings.AXES_FAILURE_LIMIT = LOGIN_LIMIT
    settings.AXES_COOLOFF_TIME = COOLOFF
    settings.SWITCHYARD_TOKEN_FAILURE_LIMIT = LOGIN_LIMIT
    return settings


def console_login(client: Client, username: str, password: str, address: str = "10.0.0.1",
                  **headers: str):
    return client.post("/login/", {"username": username, "password": password},
                       REMOTE_ADDR=address, **headers)


def admin_login(client: Client, username: str, password: str, address: str = "10.0.0.1"):
    return client.post("/admin/login/?next=/admin/",
                       {"username": username, "password": password, "next": "/admin/"},
                       REMOTE_ADDR=address)


def lockouts(object_type: str = "auth.user") -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(verb="locked_out", object_type=object_type))


def assert_locked_page(response) -> None:
    assert response.status_code == 429
    page = response.content.decode()
    assert 'id="locked-out"' in page
    assert "Too many failed logins for this account or from this address" in page
    assert "5\xa0minutes" in page or "5 minutes" in page
    assert "sessionid" not in response.cookies


def test_wrong_passwords_lock_the_console_login_even_for_the_right_one(client, alice,
                                                                         lockout_limits):
    for _ in range(LOGIN_LIMIT - 1):
        refused = console_login(client, "alice", WRONG)
        assert refused.status_code == 200
        assert "do not match" in refused.content.decode()

    assert_locked_page(console_login(client, "alice", WRONG))
    right = console_login(client, "alice", RIGHT)

    assert_locked_page(right)
    assert "_auth_user_id" not in client.session
    assert client.get("/").status_code == 302  # still anonymous: sent to the login page


def test_the_login_lockout_is_audited_once_naming_account_and_address(client, alice,
                                                                       lockout_limits):
    for _ in range(LOGIN_LIMIT + 3):
        console_login(client, "alice", WRONG, address="10.0.0.9")
    console_login(client, "alice", RIGHT, address="10.0.0.9")

    [event] = lockouts()
    assert event.tenant is None
    assert event.object_id == str(alice.pk)
    assert event.object_repr == "alice"
    assert event.actor_label == "anonymous from 10.0.0.9"
    assert event.after["ip_address"] == "10.0.0.9"
    assert event.after["failures"] == LOGIN_LIMIT
    assert event.after["path"] == "/login/"


def test_an_account_is_locked_whatever_address_the_guesses_come_from(client, alice,
                                                                      lockout_limits):
    for n in range(LOGIN_LIMIT):
        console_login(client, "alice", WRONG, address=f"10.0.1.{n}")

    assert_locked_page(console_login(client, "alice", RIGHT, address="10.0.1.200"))
    assert len(lockouts()) == 1


def test_an_address_is_locked_whatever_accounts_it_guesses(client, alice, bob, lockout_limits):
    for username in ("bob", "mallory", "eve")[:LOGIN_LIMIT]:
        console_login(client, username, WRONG, address="10.0.2.1")

    assert_locked_page(console_login(client, "alice", RIGHT, address="10.0.2.1"))
    # Only that address: alice, who failed nothing, logs in from her own.
    elsewhere = console_login(Client(), "alice", RIGHT, address="10.0.2.2")
    assert elsewhere.status_code == 302
    assert len(lockouts()) == 1


def test_the_admin_login_is_locked_the_same_way(client, root, lockout_limits):
    for _ in range(LOGIN_LIMIT - 1):
        assert admin_login(client, "root", WRONG).status_code == 200

    assert_locked_page(admin_login(client, "root", WRONG))
    assert_locked_page(admin_login(client, "root", RIGHT))
    assert client.get("/admin/").status_code == 302
    [event] = lockouts()
    assert event.after["path"] == "/admin/login/"
    # The same account on the console: locked too.
    assert_locked_page(console_login(Client(), "root", RIGHT, address="10.0.3.3"))


def test_a_login_works_again_after_the_cooloff(client, alice, lockout_limits):
    for _ in range(LOGIN_LIMIT):
        console_login(client, "alice", WRONG)
    assert_locked_page(console_login(client, "alice", RIGHT))
    locked_at = timezone.now()

    with time_machine.travel(locked_at + COOLOFF + timedelta(seconds=1), tick=False):
        back = console_login(client, "alice", RIGHT)

    assert back.status_code == 302
    assert client.session["_auth_user_id"] == str(alice.pk)


def test_each_refused_login_during_a_lockout_starts_the_cooloff_again(client, alice,
                                                                       lockout_limits):
    """An attacker who keeps guessing stays locked out; so does whoever keeps trying."""
    for _ in range(LOGIN_LIMIT):
        console_login(client, "alice", WRONG)
    locked_at = timezone.now()
    tried_at = locked_at + COOLOFF - timedelta(seconds=5)

    with time_machine.travel(tried_at, tick=False):
        assert_locked_page(console_login(client, "alice", RIGHT))
    with time_machine.travel(locked_at + COOLOFF + timedelta(seconds=1), tick=False):
        assert_locked_page(console_login(Client(), "alice", RIGHT, address="10.0.0.2"))
        tried_at = timezone.now()
    with time_machine.travel(tried_at + COOLOFF + timedelta(seconds=1), tick=False):
        back = console_login(client, "alice", RIGHT)

    assert back.status_code == 302
    assert len(lockouts()) == 1


def test_a_new_x_forwarded_for_does_not_dodge_the_login_lockout(client, alice, lockout_limits):
    for n in range(LOGIN_LIMIT):
        console_login(client, f"guess-{n}", WRONG, HTTP_X_FORWARDED_FOR=f"203.0.113.{n}")

    assert_locked_page(console_login(client, "alice", RIGHT,
                                     HTTP_X_FORWARDED_FOR="203.0.113.99"))


# --- brute force: API tokens ----------------------------------------------------------------------

UNKNOWN = "sy_0badf00d_" + "A" * 43  # well formed, matches no token
MALFORMED = "not-a-switchyard-token"


def api_get(secret: str, address: str, **headers: str):
    client = APIClient()
    return client.get("/api/v1/models/", HTTP_AUTHORIZATION=f"Bearer {secret}",
                      REMOTE_ADDR=address, **headers)


@pytest.fixture
def valid_secret(alice, tenant_a) -> str:
    return tokens.issue(alice, tenant_a, "ci").secret


def test_guessed_tokens_lock_their_address_out_even_for_a_valid_token(valid_secret,
                                                                         lockout_limits):
    guesses = [MALFORMED, UNKNOWN, MALFORMED][:LOGIN_LIMIT]
    for guess in guesses:
        assert api_get(guess, "10.1.0.1").status_code == 401

    refused = api_get(valid_secret, "10.1.0.1")

    assert refused.status_code == 429
    assert refused.json()["detail"].startswith("Too many invalid API tokens from this address.")
    assert 0 < int(refused["Retry-After"]) <= COOLOFF.total_seconds()
    assert api_get(valid_secret, "10.1.0.2").status_code == 200  # another address
    api_get(UNKNOWN, "10.1.0.1")
    [event] = lockouts("fleet.apitoken")
    assert event.actor_label == "anonymous from 10.1.0.1"
    assert event.after["failures"] == LOGIN_LIMIT


def test_expired_and_revoked_tokens_do_not_count_towards_a_lockout(alice, tenant_a, valid_secret,
                                                                     lockout_limits):
    revoked = tokens.issue(alice, tenant_a, "old")
    tokens.revoke(alice, revoked.token)
    expired = tokens.issue(alice, tenant_a, "short", expires_at=timezone.now() + timedelta(hours=1))
    APIToken.objects.filter(pk=expired.token.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1))

    for _ in range(LOGIN_LIMIT * 2):
        assert api_get(revoked.secret, "10.1.1.1").json()["detail"] == "token revoked"
        assert api_get(expired.secret, "10.1.1.1").json()["detail"] == "token expired"

    assert api_get(valid_secret, "10.1.1.1").status_code == 200
    assert lockouts("fleet.apitoken") == []


def test_a_new_x_forwarded_for_does_not_dodge_the_token_lockout(valid_secret, lockout_limits):
    for n in range(LOGIN_LIMIT):
        api_get(UNKNOWN, "10.1.2.1", HTTP_X_FORWARDED_FOR=f"198.51.100.{n}")

    assert api_get(valid_secret, "10.1.2.1",
                   HTTP_X_FORWARDED_FOR="198.51.100.99").status_code == 429


def test_behind_a_trusted_proxy_the_address_is_the_one_the_proxy_saw(valid_secret,
                                                                      lockout_limits):
    lockout_limits.SWITCHYARD_TRUST_PROXY_HEADERS = True
    proxy = "10.1.3.1"
    # The proxy appends the address it saw; what the client sent before it is not believed.
    for n in range(LOGIN_LIMIT):
        api_get(UNKNOWN, proxy, HTTP_X_FORWARDED_FOR=f"192.0.2.{n}, 203.0.113.7")

    assert api_get(valid_secret, proxy,
                   HTTP_X_FORWARDED_FOR="192.0.2.99, 203.0.113.7").status_code == 429
    assert api_get(valid_secret, proxy, HTTP_X_FORWARDED_FOR="203.0.113.8").status_code == 200
    [event] = lockouts("fleet.apitoken")
    assert event.after["ip_address"] == "203.0.113.7"


def test_a_token_lockout_ends_after_the_cooloff(valid_secret, lockout_limits):
    lockout_limits.AXES_COOLOFF_TIME = timedelta(seconds=1)
    for _ in range(LOGIN_LIMIT):
        api_get(UNKNOWN, "10.1.4.1")
    assert api_get(valid_secret, "10.1.4.1").status_code == 429
    locked_at = time.monotonic()

    # Redis expires the counter after the 1 s cool-off; allow 4 s for a busy machine.
    while api_get(valid_secret, "10.1.4.1").status_code == 429:
        assert time.monotonic() - locked_at < 5, "still locked 5 s after a 1 s cool-off"
        time.sleep(0.2)
    assert time.monotonic() - locked_at >= 0.5


# --- Content-Security-Policy ---------------------------------------------------------------------

REPO_ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = REPO_ROOT / "templates"


def csp(response) -> dict[str, list[str]]:
    """The response's Content-Security-Policy, directive → sources."""
    header = response.get("Content-Security-Policy")
    assert header, f"{response.wsgi_request.path} answers no Content-Security-Policy"
    directives = {}
    for part in header.split(";"):
        name, *sources = part.split()
        directives[name] = sources
    return directives


def assert_strict_scripts(response) -> None:
    policy = csp(response)
    path = response.wsgi_request.path
    for directive in ("script-src", "script-src-elem", "script-src-attr"):
        assert "'unsafe-inline'" not in policy.get(directive, []), f"{path}: {directive}"
        assert "'unsafe-eval'" not in policy.get(directive, []), f"{path}: {directive}"
    assert policy["script-src"] == ["'self'"], path
    assert policy["default-src"] == ["'self'"], path
    assert policy["object-src"] == ["'none'"], path
    assert policy["base-uri"] == ["'self'"], path
    assert policy["frame-ancestors"] == ["'none'"], path


@pytest.mark.parametrize("page", [p for p in MATRIX_PAGES if p.method == "GET"],
                         ids=lambda p: p.id)
def test_every_console_page_answers_a_policy_without_inline_script(request, db, page):
    world = MatrixWorld(request)
    for name in page.setup:
        getattr(world, name)
    persona = "anonymous" if page.scope == "login" else "alice"
    if page.role == PLATFORM:
        persona = "root"
    headers = {"HTTP_HX_REQUEST": "true"} if page.htmx else {}

    response = world.browser(persona).get(page.url(world), **headers)

    # What the matrix expects (a partial with nothing left to change answers 286).
    assert response.status_code == page.expected(persona)
    assert_strict_scripts(response)


@pytest.mark.parametrize("path", ["/admin/", "/admin/fleet/apitoken/", "/api/docs/",
                                  "/api/redoc/", "/api/v1/"])
def test_the_admin_and_the_api_pages_answer_the_same_script_policy(client, root, path):
    client.force_login(root)

    response = client.get(path)

    assert response.status_code == 200
    assert_strict_scripts(response)


def test_error_and_lockout_pages_answer_the_policy_too(client, alice, lockout_limits):
    assert_strict_scripts(client.get("/registry/models/999999/", follow=False))
    for _ in range(LOGIN_LIMIT):
        locked = console_login(client, "alice", WRONG)
    assert locked.status_code == 429
    assert_strict_scripts(locked)


SCRIPT_TAG = re.compile(r"<script\b(?P<attrs>[^>]*)>(?P<body>.*?)</script\s*>", re.I | re.S)
HANDLER_ATTR = re.compile(r"<[a-z][^>]*?\s(?P<attr>on[a-z]+)\s*=", re.I | re.S)
JS_URL = re.compile(r"""(?:href|src|action|formaction)\s*=\s*["']?\s*javascript:""", re.I)
HTMX_SCRIPTING = re.compile(r"\s(?P<attr>hx-on\b[^=\s]*|hx-on:[^=\s]*|hx-vals\s*=\s*['\"]\s*js:"
                            r"|hx-vars)", re.I)
HX_TRIGGER = re.compile(r"""hx-trigger\s*=\s*(?:"(?P<dq>[^"]*)"|'(?P<sq>[^']*)')""", re.I)
# An event filter, "every 3s [cond]" or "click[cond]"; not a selector as in "from:input[type=x]".
EVENT_FILTER = re.compile(r"(?:^|[\s,])[\w.-]*\[")


def trigger_filters(text: str) -> list[str]:
    values = [m["dq"] if m["dq"] is not None else m["sq"] for m in HX_TRIGGER.finditer(text)]
    return [value for value in values if EVENT_FILTER.search(value)]


def template_files() -> list[Path]:
    files = sorted(TEMPLATES.rglob("*.html"))
    assert len(files) > 20, "the templates folder moved?"
    return files


def test_no_template_has_an_inline_script_or_handler():
    """Each would be refused by the policy in the browser; ``console.js`` does their work."""
    found = []
    for path in template_files():
        text = path.read_text()
        name = path.relative_to(TEMPLATES)
        for tag in SCRIPT_TAG.finditer(text):
            if tag["body"].strip() or "src=" not in tag["attrs"]:
                found.append(f"{name}: inline <script{tag['attrs']}>")
        found += [f"{name}: {m['attr']}= handler" for m in HANDLER_ATTR.finditer(text)]
        found += [f"{name}: javascript: URL" for _ in JS_URL.finditer(text)]
        # htmx runs these through eval(), which the policy refuses too.
        found += [f"{name}: {m['attr']}" for m in HTMX_SCRIPTING.finditer(text)]
        found += [f"{name}: hx-trigger filter {value!r}" for value in trigger_filters(text)]

    assert found == []


def test_the_template_scan_finds_what_it_looks_for():
    page = """<script>alert(1)</script><script src="/x.js"></script>
    <button type="button" onclick="go()">x</button><a href="javascript:go()">y</a>
    <div hx-on:click="go()"></div><div hx-trigger="every 1s [go('x')]"></div>
    <div hx-trigger='click[ctrlKey]'></div><form hx-trigger="change from:input[type=text]">"""
    assert len([t for t in SCRIPT_TAG.finditer(page) if t["body"].strip()]) == 1
    assert [m["attr"] for m in HANDLER_ATTR.finditer(page)] == ["onclick"]
    assert len(JS_URL.findall(page)) == 1
    assert len(HTMX_SCRIPTING.findall(page)) == 1
    assert trigger_filters(page) == ["every 1s [go('x')]", "click[ctrlKey]"]


# --- proxy headers ---------------------------------------------------------------------------------

PROBE = """
import json
from django.conf import settings
from django.test import RequestFactory
from fleet.tenancy.lockouts import client_ip
request = RequestFactory().get("/", HTTP_X_FORWARDED_PROTO="https",
                               HTTP_X_FORWARDED_FOR="192.0.2.1, 203.0.113.7",
                               REMOTE_ADDR="10.9.9.9")
print(json.dumps({"header": settings.SECURE_PROXY_SSL_HEADER, "secure": request.is_secure(),
                  "ip": client_ip(request)}))
"""


def settings_under(**env: str | None) -> dict[str, Any]:
    """What console.settings makes of the proxy headers in a fresh process with ``env``."""
    environ = {k: v for k, v in os.environ.items() if k != "SWITCHYARD_TRUST_PROXY_HEADERS"}
    environ |= {k: v for k, v in env.items() if v is not None}
    result = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", PROBE], cwd=REPO_ROOT, env=environ,
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_x_forwarded_proto_and_for_are_ignored_by_default():
    assert settings_under() == {"header": None, "secure": False, "ip": "10.9.9.9"}
    assert settings_under(SWITCHYARD_TRUST_PROXY_HEADERS="false")["secure"] is False


def test_a_trusted_proxy_says_https_and_the_address_it_saw():
    assert settings_under(SWITCHYARD_TRUST_PROXY_HEADERS="true") == {
        "header": ["HTTP_X_FORWARDED_PROTO", "https"], "secure": True, "ip": "203.0.113.7"}


def test_in_this_process_a_client_cannot_claim_https(client):
    response = client.get("/login/", HTTP_X_FORWARDED_PROTO="https")

    assert response.wsgi_request.is_secure() is False


# --- the policy in a real browser ---------------------------------------------------------------

# Runs before any page script (Playwright's init scripts are not subject to the page's policy).
RECORD_VIOLATIONS = """
window.__violations = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__violations.push(
    `${e.effectiveDirective} refused ${e.blockedURI || "?"} (${e.sourceFile || "?"}:${e.lineNumber})`);
});
"""


class Watched:
    """A logged-in page that records policy violations and console errors, page by page."""

    def __init__(self, browser: Browser, base_url: str) -> None:
        self.base_url = base_url
        self.context = browser.new_context(viewport={"width": 1400, "height": 900})
        self.context.add_init_script(RECORD_VIOLATIONS)
        self.page = self.context.new_page()
        self.page.set_default_timeout(10_000)
        self.errors: list[str] = []
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(
            f"{m.text} ({m.location.get('url')})"))
        self.page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))

    def visit(self, path: str) -> list[str]:
        """Open ``path``, let its scripts start, and return what went wrong there."""
        self.errors.clear()
        response = self.page.goto(self.base_url + path, wait_until="load")
        assert response is not None and response.status == 200, path
        self.page.wait_for_load_state("networkidle")
        return self.problems()

    def problems(self) -> list[str]:
        return self.page.evaluate("window.__violations") + self.errors

    def log_in(self, username: str) -> None:
        assert self.visit("/login/") == []
        self.page.fill("#id_username", username)
        self.page.fill("#id_password", RIGHT)
        self.page.click("button[type=submit]")
        expect(self.page.locator("header.topbar .user")).to_contain_text(username)


@pytest.fixture
def watched(browser, live_server, transactional_db) -> Iterator[Callable[[str], Watched]]:
    made: list[Watched] = []

    def make(username: str) -> Watched:
        w = Watched(browser, live_server.url)
        made.append(w)
        w.log_in(username)
        return w

    yield make
    for w in made:
        w.context.close()


@pytest.fixture
def console_world(tenant_a, alice):
    cluster = ClusterFactory(name="cluster-1")
    server = InferenceServerFactory(cluster=cluster, name="triton-1")
    model = ModelFactory(tenant=tenant_a, name="fraud-scorer")
    version = ModelVersionFactory(model=model, version=1)
    deployment = DeploymentFactory(model=model, cluster=cluster, name="fraud-prod")
    deployment.servers.set([server])
    load = ModelLoad.objects.create(tenant=tenant_a, deployment=deployment, server=server,
                                    version=version, requested_by_label="alice")
    token = tokens.issue(alice, tenant_a, "ci-pipeline").token
    AuditEvent.objects.create(tenant=tenant_a, actor_label="alice", verb="noted",
                              object_type="tests.seed", object_id="1", object_repr="seed")
    return {
        "server": f"/fleet/servers/{server.pk}/",
        "model": f"/registry/models/{model.pk}/",
        "version": f"/registry/versions/{version.pk}/",
        "deployment": f"/registry/deployments/{deployment.pk}/",
        "load": f"/registry/loads/{load.pk}/",
        "token": token,
    }


REDOC_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"


@pytest.mark.browser
def test_the_console_runs_under_its_policy_in_a_browser(watched, console_world):
    """Every main page loads with no policy violation and no console error."""
    w = watched("alice")
    pages = ["/", "/fleet/", console_world["server"], "/fleet/quotas/", "/registry/",
             console_world["model"], console_world["version"], "/registry/deployments/",
             console_world["deployment"], console_world["load"], "/fleet/tokens/", "/audit/"]

    problems = {path: w.visit(path) for path in pages}

    assert problems == {path: [] for path in pages}
    # The recorder works, and the policy is on: an inline script added now is refused.
    w.page.evaluate("""() => { const s = document.createElement("script");
        s.textContent = "window.__inlineRan = true"; document.body.append(s); }""")
    assert w.page.evaluate("window.__inlineRan") is None
    assert any(v.startswith("script-src-elem refused inline") for v in w.problems())


@pytest.mark.browser
def test_the_api_docs_render_under_the_policy(watched, alice):
    w = watched("alice")

    assert w.visit("/api/docs/") == []
    # Every tag of the schema is drawn (Swagger UI once stopped partway down, silently), and
    # one opens on a click.
    tags = {op["tags"][0] for path in SchemaGenerator().get_schema(public=True)["paths"].values()
            for op in path.values()}
    for tag in sorted(tags):
        expect(w.page.locator(f"#operations-tag-{tag}")).to_be_visible()
    w.page.locator("#operations-tag-deployments").click()
    expect(w.page.locator(".swagger-ui .opblock").first).to_be_visible()
    expect(w.page.locator(".swagger-ui")).to_contain_text("/api/v1/deployments/")

    redoc = w.visit("/api/redoc/")
    expect(w.page.locator("redoc h1").first).to_be_visible()
    expect(w.page.locator("redoc")).to_contain_text("/api/v1/deployments/")
    # ReDoc asks for its logo once it has drawn its sidebar, which may be after the page was
    # first read: wait for the refusal (a busy machine took more than a network-idle wait).
    for _ in range(50):
        if redoc:
            break
        w.page.wait_for_timeout(100)
        redoc = w.problems()
    # ReDoc always shows a logo from its vendor's CDN; the policy keeps that request from
    # leaving (ReDoc then hides the image). It is the only refusal (reported once or twice:
    # the browser's console line and the page's violation event need not both arrive before
    # the page is read).
    assert redoc and len(redoc) <= 2 and all(REDOC_LOGO in p for p in redoc), redoc


@pytest.mark.browser
def test_the_admin_runs_under_the_policy_in_a_browser(watched, console_world, root):
    w = watched("root")

    for path in ["/admin/", "/admin/fleet/apitoken/", "/admin/auth/user/add/"]:
        assert w.visit(path) == [], path


@pytest.mark.browser
def test_a_data_confirm_form_asks_before_it_submits(watched, console_world):
    w = watched("alice")
    w.visit("/fleet/tokens/")
    token = console_world["token"]
    asked: list[str] = []
    posts: list[str] = []
    w.page.on("request", lambda r: r.method == "POST" and posts.append(r.url))
    revoke = w.page.get_by_role("button", name="Revoke")

    def no(dialog: Dialog) -> None:
        asked.append(dialog.message)
        dialog.dismiss()

    w.page.once("dialog", no)
    revoke.click()
    w.page.wait_for_timeout(300)  # a submission would have started within the click

    assert asked == ["Revoke token ci-pipeline? Pipelines using it will get 401."]
    assert posts == []
    assert APIToken.objects.get(pk=token.pk).revoked_at is None

    w.page.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.accept()))
    revoke.click()

    expect(w.page.get_by_role("button", name="Revoke")).to_have_count(0)
    assert len(asked) == 2
    assert len(posts) == 1 and posts[0].endswith(f"/fleet/tokens/{token.pk}/revoke/")
    assert APIToken.objects.get(pk=token.pk).revoked_at is not None
    assert w.problems() == []


@pytest.mark.browser
def test_htmx_still_polls_under_the_policy_while_the_tab_is_visible(watched, console_world):
    """The fleet table is loaded by htmx, fetched again every 3 s, and not while hidden."""
    w = watched("alice")
    polls: list[float] = []
    w.page.on("response", lambda r: "/fleet/servers/live/" in r.url
              and r.status == 200 and polls.append(time.monotonic()))

    w.visit("/fleet/")
    expect(w.page.locator('tr[data-server="triton-1"]')).to_be_visible()
    deadline = time.monotonic() + 10  # the first load, two 3 s periods, room for a busy machine
    while len(polls) < 3 and time.monotonic() < deadline:
        w.page.wait_for_timeout(250)
    assert len(polls) >= 3, f"htmx fetched the table {len(polls)} times in 10 s"

    # A hidden tab asks for nothing: over two periods and more, htmx starts no request.
    w.page.evaluate("""() => {
        window.__sent = 0;
        document.addEventListener("htmx:beforeRequest", () => { window.__sent += 1; });
        Object.defineProperty(document, "visibilityState", {value: "hidden", configurable: true});
    }""")
    w.page.wait_for_timeout(7_000)
    assert w.page.evaluate("window.__sent") == 0

    w.page.evaluate("delete document.visibilityState")  # visible again
    # (Polled from here: wait_for_function evaluates a string, which the policy refuses.)
    deadline = time.monotonic() + 10
    while w.page.evaluate("window.__sent") == 0 and time.monotonic() < deadline:
        w.page.wait_for_timeout(250)
    assert w.page.evaluate("window.__sent") > 0, "no poll within 10 s of the tab showing again"
    expect(w.page.locator('tr[data-server="triton-1"]')).to_be_visible()
    assert w.problems() == []
