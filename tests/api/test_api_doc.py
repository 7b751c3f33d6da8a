"""docs/api.md works as written against the demo: its requests, run in order, answer what it shows.

The doc's convention (its section "The CI flow with curl" states it for the reader):

- a request is a ```bash block holding one ``api`` (the doc's curl helper) or ``curl``
  command; the next fenced block, an ```http block, is its answer: ``HTTP/1.1 <status>
  <reason>``, a blank line, the JSON body (none for a 204);
- ``| tee FILE`` keeps the answer, and a ```bash block of ``NAME=$(jq -r .field FILE)`` lines
  reads it into a variable that later requests use (``$SWITCHYARD_TOKEN``);
- every field an answer shows must be in the API's answer with the value shown, except times
  (``*_at``, ``t``, ``age_s``), secrets and URLs (whose ports differ), of which only the
  presence is checked, and the points of a latency series (measured figures: their fields
  only); ``…`` in a text stands for any text; a list shows every element.

GIVEN the demo as ``./scripts/demo`` leaves it before anyone acts: seeded, its artifacts in a
real S3 endpoint (moto), its approved versions loaded on the session's real Triton and routed
through a real nginx, and alice's admin token made in the console,
WHEN the doc's requests run in order, with people and Switchyard's background work stepping in
where the doc says (erin approves in the console; the worker carries out loads; beat makes
routes and scrapes the servers' metrics),
THEN every answer has the documented status and fields.
"""

from __future__ import annotations

import http
import json
import re
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.urls import Resolver404, resolve
from rest_framework.test import APIClient

from fleet.adapters.triton_runtime import TritonServerRuntime
from fleet.models import InferenceServer, Membership, Tenant
from fleet.tenancy import tokens
from local import demo
from local.s3 import DEMO_ACCESS_KEY_ID, DEMO_REGION, DEMO_SECRET_ACCESS_KEY
from local.triton import start_triton, write_demo_repository
from rollouts.loads import reconciler
from rollouts.models import ModelLoad
from rollouts.traffic import latency, routes
from tests.fixtures import sent_tasks

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
FENCE = re.compile(r"^```(\w*)\s*$")
CAPTURE = re.compile(r"^(?P<name>[A-Za-z_]\w*)=\$\(jq -r (?P<expr>\S+) (?P<file>\S+)\)$")
VARIABLE = re.compile(r"\$\{?([A-Za-z_]\w*)\}?")
STATUS_LINE = re.compile(r"^HTTP/1\.1 (\d{3}) (.+)$")
# Fields whose values differ on every run: only their presence is checked.
UNSTABLE = {"t", "age_s", "token", "prefix", "secret", "secret_prefix", "url", "route_url",
            "upstream"}
# Lists of measured points: each point's fields are checked, not their values or number.
MEASURED = {"points"}
# Requests the walkthrough must make (method, path pattern), so that a step turned into
# prose, or an answer block into plain JSON, is noticed.
REQUIRED = [
    ("POST", r"/api/v1/tokens/"),
    ("POST", r"/api/v1/models/"),
    ("POST", r"/api/v1/versions/"),
    ("POST", r"/api/v1/versions/\d+/request-approval/"),
    ("POST", r"/api/v1/versions/\d+/approve/"),
    ("POST", r"/api/v1/aliases/"),
    ("POST", r"/api/v1/deployments/"),
    ("POST", r"/api/v1/loads/"),
    ("GET", r"/api/v1/loads/\d+/"),
    ("GET", r"/api/v1/audit-events/"),
    ("GET", r"/api/v1/deployments/\d+/latency/"),
    ("GET", r"/api/v1/deployments/\d+/consistency/"),
    ("POST", r"/api/v1/deployments/\d+/converge/"),
    ("GET", r"/api/v1/routes/\d+/"),
    ("PATCH", r"/api/v1/routes/\d+/"),
    ("DELETE", r"/api/v1/routes/\d+/"),
    ("POST", r"/api/v1/rollouts/"),
    ("POST", r"/api/v1/rollouts/\d+/abort/"),
    ("POST", r"/api/v1/webhooks/"),
]
APPROVE = re.compile(r"/api/v1/versions/\d+/approve/")
LATENCY = re.compile(r"/api/v1/deployments/\d+/latency/")
NO_BODY = object()


# --------------------------------------------------------------------------------------------
# Reading the doc
# --------------------------------------------------------------------------------------------


@dataclass
class Block:
    lang: str
    text: str
    line: int  # of the opening fence, 1-based
    heading: str


@dataclass
class Answer:
    status: int
    body: Any


@dataclass
class Request:
    where: str
    method: str
    path: str
    headers: dict[str, str]
    body: str | None
    tee: str | None
    answer: Answer


@dataclass
class Capture:
    where: str
    name: str
    expr: str
    file: str


def read_blocks(text: str) -> list[Block]:
    """The fenced code blocks of the markdown, with the heading each stands under."""
    found: list[Block] = []
    heading, fence, lines = "", None, []
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if fence is None:
            if match:
                fence, lines = Block(match.group(1), "", number, heading), []
            elif line.startswith("#"):
                heading = line.lstrip("#").strip()
        elif line.strip() == "```":
            fence.text = "\n".join(lines)
            found.append(fence)
            fence = None
        else:
            lines.append(line)
    return found


def read_steps(blocks: list[Block]) -> list[Request | Capture]:
    """The requests (a bash block answered by the http block after it) and the captures."""
    steps: list[Request | Capture] = []
    for index, block in enumerate(blocks):
        if block.lang != "bash":
            continue
        where = f"docs/api.md:{block.line} ({block.heading})"
        following = blocks[index + 1] if index + 1 < len(blocks) else None
        if following is not None and following.lang == "http":
            steps.append(read_request(block.text, where, read_answer(following.text, where)))
            continue
        lines = [ln.strip() for ln in block.text.splitlines() if ln.strip()]
        if lines and all(CAPTURE.match(ln) for ln in lines):
            steps += [Capture(where, **CAPTURE.match(ln).groupdict()) for ln in lines]
    return steps


def read_request(text: str, where: str, answer: Answer) -> Request:
    words = shlex.split(text.replace("\\\n", " "), comments=True)
    tee = None
    if "|" in words:
        at = words.index("|")
        assert words[at + 1:at + 2] == ["tee"] and len(words) == at + 3, (
            f"{where}: a request pipes only into `tee FILE`: {text}")
        tee, words = words[at + 2], words[:at]
    assert words and words[0] in ("api", "curl"), f"{where}: not an api or curl command: {text}"
    headers: dict[str, str] = {}
    if words[0] == "api":  # the doc's helper: curl with the pipeline's token, JSON
        headers = {"Authorization": "Bearer $SWITCHYARD_TOKEN", "Content-Type": "application/json"}
    method, url, body = None, None, None
    rest = iter(words[1:])
    for word in rest:
        if word == "-X":
            method = next(rest)
        elif word == "-H":
            name, _, value = next(rest).partition(":")
            headers[name.strip()] = value.strip()
        elif word in ("-d", "--data"):
            body = next(rest)
        elif word in ("-sS", "-s", "-S", "--fail-with-body"):
            continue
        elif word.startswith("$SY/"):
            url = word
        else:
            raise AssertionError(f"{where}: the test does not know {word!r} in: {text}")
    assert url is not None, f"{where}: no \"$SY/...\" URL in: {text}"
    method = method or ("POST" if body is not None else "GET")
    return Request(where, method, url.removeprefix("$SY"), headers, body, tee, answer)


def read_answer(text: str, where: str) -> Answer:
    status_line, _, rest = text.partition("\n")
    match = STATUS_LINE.match(status_line.strip())
    assert match, f"{where}: an answer starts with its status line, got {status_line!r}"
    status, reason = int(match.group(1)), match.group(2).strip()
    assert reason == http.HTTPStatus(status).phrase, (
        f"{where}: {status} is {http.HTTPStatus(status).phrase!r}, not {reason!r}")
    body = rest.strip()
    if not body:
        return Answer(status, NO_BODY)
    try:
        return Answer(status, json.loads(body))
    except json.JSONDecodeError as exc:
        raise AssertionError(f"{where}: the answer's body is not JSON: {exc}") from None


# --------------------------------------------------------------------------------------------
# Comparing answers
# --------------------------------------------------------------------------------------------


def differences(shown: Any, got: Any, path: str = "answer") -> list[str]:
    """How ``got`` differs from what the doc ``shown`` (empty when it shows the truth)."""
    if isinstance(shown, dict):
        if not isinstance(got, dict):
            return [f"{path}: the doc shows an object, the API answered {got!r}"]
        found = []
        for key, value in shown.items():
            where = f"{path}.{key}"
            if key not in got:
                found.append(f"{where}: missing from the API's answer (it has {sorted(got)})")
            elif key in MEASURED:
                found += measured_differences(value, got[key], where)
            elif not (key in UNSTABLE or key.endswith("_at")):
                found += differences(value, got[key], where)
        return found
    if isinstance(shown, list):
        if not isinstance(got, list) or len(got) != len(shown):
            return [f"{path}: the doc shows {len(shown)} elements, the API answered {got!r}"]
        return [d for i, (s, g) in enumerate(zip(shown, got, strict=True))
                for d in differences(s, g, f"{path}[{i}]")]
    if isinstance(shown, str) and "…" in shown and isinstance(got, str):
        pattern = ".*".join(re.escape(part) for part in shown.split("…"))
        return [] if re.fullmatch(pattern, got, re.DOTALL) else [f"{path}: {got!r} is not {shown!r}"]
    if isinstance(shown, bool) or isinstance(got, bool) or shown is None or got is None:
        same = shown is got
    elif isinstance(shown, int | float) and isinstance(got, int | float):
        same = shown == got
    else:
        same = type(shown) is type(got) and shown == got
    return [] if same else [f"{path}: the doc shows {shown!r}, the API answered {got!r}"]


def measured_differences(shown: Any, got: Any, path: str) -> list[str]:
    if not isinstance(got, list) or not got:
        return [f"{path}: the API answered {got!r}, not a list of points"]
    fields = {key for point in shown for key in point}
    return [f"{path}: a point lacks {sorted(fields - set(point))}"
            for point in got if not fields <= set(point)][:1]


# --------------------------------------------------------------------------------------------
# The demo, and what happens in it between two requests
# --------------------------------------------------------------------------------------------


@dataclass
class Demo:
    """The demo's world: variables of the reader's shell, files the doc tees, and what people
    and Switchyard's worker and beat do between the requests."""

    variables: dict[str, str]
    files: dict[str, Any] = field(default_factory=dict)
    ran: list[tuple[str, str]] = field(default_factory=list)

    def expand(self, text: str, where: str) -> str:
        def value(match: re.Match[str]) -> str:
            assert match.group(1) in self.variables, f"{where}: ${match.group(1)} is not set"
            return self.variables[match.group(1)]

        return VARIABLE.sub(value, text)

    def capture(self, step: Capture) -> None:
        assert step.file in self.files, f"{step.where}: no request tees into {step.file}"
        value = self.files[step.file]
        for part in re.findall(r"\.(\w+)|\[(\d+)\]", step.expr):
            value = value[part[0]] if part[0] else value[int(part[1])]
        self.variables[step.name] = str(value)

    def send(self, step: Request) -> Any:
        headers = {name: self.expand(value, step.where) for name, value in step.headers.items()}
        content_type = headers.pop("Content-Type", "application/octet-stream")
        extra = {f"HTTP_{name.upper().replace('-', '_')}": value for name, value in headers.items()}
        path = self.expand(step.path, step.where)
        self.before(path)
        response = APIClient().generic(step.method, path, step.body or "", content_type, **extra)
        self.ran.append((step.method, path.partition("?")[0]))
        body = response.json() if response.content else NO_BODY
        assert response.status_code == step.answer.status, (
            f"{step.where}: {step.method} {path} answered {response.status_code}, the doc shows "
            f"{step.answer.status}: {body}")
        if step.answer.body is NO_BODY:
            assert body is NO_BODY, f"{step.where}: the doc shows no body, the API answered {body}"
        else:
            found = differences(step.answer.body, body)
            assert not found, f"{step.where}: {step.method} {path}:\n" + "\n".join(found)
        if step.tee:
            self.files[step.tee] = body
        self.after(step, path, response.status_code, body)
        return body

    def before(self, path: str) -> None:
        if LATENCY.fullmatch(path.partition("?")[0]):
            # Beat has the servers' metrics scraped every second; a point needs two scrapes.
            latency.tick()
            time.sleep(0.2)
            latency.tick()

    def after(self, step: Request, path: str, status: int, body: Any) -> None:
        if step.method == "POST" and path == "/api/v1/loads/" and status == 202:
            # The worker carries out the loads (and unloads); beat then routes a deployment
            # whose first version is ready.
            for row in body:
                settled = reconciler.run_to_end(row["id"], max_steps=40)
                assert settled.state not in ModelLoad.IN_FLIGHT, f"load {row['id']} did not settle"
            routes.ensure_routes()
        if step.method == "POST" and APPROVE.fullmatch(path) and status == 403:
            # The token may not decide; erin, the tenant's approver, approves in the console,
            # whose form calls what the API calls for her session.
            erin = APIClient()
            erin.force_login(get_user_model().objects.get(username="erin"))
            decided = erin.post(path, {"reason": "offline eval reviewed"}, format="json")
            assert decided.status_code == 200, decided.content


@pytest.fixture(scope="module")
def local_triton(triton_runtime, tmp_path_factory):
    """A Triton of the walkthrough's own, with the demo models: the walkthrough registers and
    loads fraud-scorer v4, and Triton lists a version it was told to unload for as long as it
    runs, so the session's shared Triton would not stay as the other tests expect it."""
    base = tmp_path_factory.mktemp("doc-triton")
    repository = base / "models"
    server = start_triton(triton_runtime, repository, load_models=write_demo_repository(repository),
                          log_path=base / "tritonserver.log")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def demo_world(settings, monkeypatch, tmp_path, moto_s3, local_triton, use_route_nginx):
    """The demo after ``./scripts/demo`` started and before anyone acted in it, on the
    session's moto and nginx and a Triton of its own; v4 of fraud-scorer is taken off it
    afterwards."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.SWITCHYARD_S3_ENDPOINT_URL = moto_s3.endpoint_url
    settings.SWITCHYARD_S3_ACCESS_KEY_ID = DEMO_ACCESS_KEY_ID
    settings.SWITCHYARD_S3_SECRET_ACCESS_KEY = DEMO_SECRET_ACCESS_KEY
    settings.SWITCHYARD_ARTIFACT_CACHE = tmp_path / "cache"
    settings.SWITCHYARD_LOAD_TIMEOUT_S = 45
    # The seed uploads with boto3's usual credentials, as the demo's environment gives them.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", DEMO_ACCESS_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", DEMO_SECRET_ACCESS_KEY)
    monkeypatch.setenv("AWS_DEFAULT_REGION", DEMO_REGION)
    demo.seed("switchyard-demo", s3_endpoint=moto_s3.endpoint_url)
    # The demo's Triton is the session's (the seed recorded the demo's ports and folders).
    InferenceServer.objects.filter(name="triton-local").update(
        http_url=local_triton.http_url, grpc_url="", metrics_url=local_triton.metrics_url,
        model_repository=str(local_triton.model_repository), log_path=str(local_triton.log_path))
    server = InferenceServer.objects.get(name="triton-local")
    monkeypatch.setattr("local.demo.local_cluster.register_configured", lambda: server)
    # The rollout the doc asks for waits for its approver: no tick of the reconciler is needed
    # to answer as documented, so none is sent to a broker.
    sent_tasks.catch(monkeypatch, "rollouts.tasks.advance_rollout", lambda rollout_id: None)
    try:
        # As `seed_demo --load` does: each load carried out and routed in turn, so the routes
        # take the ports the README and docs/operations.md name (the first free ones).
        made = demo.route_in_order(demo.request_demo_loads())
        assert {route.deployment.name: int(route.url.rsplit(":", 1)[1]) for route in made} == (
            demo.route_ports())
        # alice makes the admin token on the console's API tokens page.
        alice = get_user_model().objects.get(username="alice")
        admin = tokens.issue(alice, Tenant.objects.get(slug="acme"), "alice-admin",
                             Membership.Role.ADMIN)
        yield Demo({"SY": "", "ADMIN_TOKEN": admin.secret})
    finally:
        # Leave the Triton as the next test of the module expects it: without the version.
        runtime = TritonServerRuntime(local_triton.http_url, local_triton.model_repository,
                                      timeout=60)
        index = httpx.post(f"{local_triton.http_url}/v2/repository/index", timeout=5).json()
        if any(r["name"] == "fraud-scorer" and r.get("version") == "4" and r.get("state") == "READY"
               for r in index):
            runtime.unload("fraud-scorer", 4)
        runtime.remove("fraud-scorer", 4)


# --------------------------------------------------------------------------------------------
# The tests
# --------------------------------------------------------------------------------------------


@pytest.mark.triton
@pytest.mark.django_db(transaction=True, reset_sequences=True)
def test_the_walkthrough_answers_as_documented_against_the_demo(demo_world):
    steps = read_steps(read_blocks(DOC.read_text()))

    for step in steps:
        if isinstance(step, Capture):
            demo_world.capture(step)
        else:
            demo_world.send(step)

    for method, pattern in REQUIRED:
        assert any(m == method and re.fullmatch(pattern, p) for m, p in demo_world.ran), (
            f"docs/api.md no longer runs {method} {pattern} as a request with its answer")


def test_every_api_path_in_the_doc_exists():
    """The paths of every example, run or not (polling loops, CLI flows), name an endpoint."""
    text = DOC.read_text()
    paths = set(re.findall(r"\$SY(/api/[^\"'\s?]*)", text))
    assert len(paths) > 20
    missing = []
    for path in sorted(paths):
        concrete = VARIABLE.sub("1", path)
        try:
            resolve(concrete)
        except Resolver404:
            missing.append(path)
    assert missing == []


def test_a_doc_that_drifts_from_the_api_is_caught():
    """The comparison itself: a renamed field, another value, a list of another length fail;
    times, URLs and `…` parts do not."""
    got = {"id": 3, "state": "ready", "created_at": "2026-11-24T09:00:00Z",
           "url": "http://127.0.0.1:40001", "events": [{"message": "placed into /tmp/x/models"}]}

    assert differences({"id": 3, "state": "ready", "created_at": "2020-01-01T00:00:00Z",
                        "url": "http://127.0.0.1:18103",
                        "events": [{"message": "placed into …/models"}]}, got) == []
    assert differences({"status": "ready"}, got)  # a renamed field
    assert differences({"state": "loading"}, got)  # another value
    assert differences({"id": "3"}, got)  # another type
    assert differences({"events": []}, got)  # another number of elements
    assert differences({"events": [{"message": "placed into …/triton/models"}]}, got)
