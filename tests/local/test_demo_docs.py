"""What the README and the docs say about the demo is what the demo makes: its users and their
roles, the versions it seeds and loads, its routes' ports, and the console pages they name."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from django.conf import settings
from django.urls import Resolver404, resolve

from local import demo
from local.management.commands.run_demo import Command as RunDemo
from rollouts.models import Deployment, ModelVersion

ROOT = Path(settings.BASE_DIR)
README = ROOT / "README.md"
OPERATIONS = ROOT / "docs" / "operations.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
CONSOLE_PREFIXES = ("/registry/", "/fleet/", "/audit/", "/live/", "/deployments/", "/rollouts/",
                    "/loads/", "/benchmarks/", "/versions/", "/models/", "/approvals/")


def text(path: Path) -> str:
    """The file with its line breaks and runs of spaces as one space (prose wraps anywhere)."""
    return re.sub(r"\s+", " ", path.read_text())


def words(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``: a list as the docs write it."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


@pytest.fixture
def seeded(db, settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    demo.seed("switchyard-demo")


def login_sentence(said: str) -> str:
    found = re.search(r"Log in as (.+?) or `?root`? \(platform admin\)", said)
    assert found, "no 'Log in as ... or root (platform admin)' sentence"
    return found.group(1)


def test_every_demo_user_is_listed_with_its_tenant_and_role():
    wanted = {(name, slug, str(role)) for name, slug, role in demo.USERS}
    out = io.StringIO()
    RunDemo(stdout=out)._banner(8000, "switchyard-demo", Path("logs"))
    for source, said in [("README.md", text(README)), ("docs/operations.md", text(OPERATIONS)),
                         ("run_demo's banner", re.sub(r"\s+", " ", out.getvalue()))]:
        listed = set(re.findall(r"`?(\w+)`? \((\w+) (\w+)\)", login_sentence(said)))
        assert listed == wanted, source


def test_the_seeded_versions_and_the_loaded_ones_are_those_the_docs_name(seeded):
    readme, operations = text(README), text(OPERATIONS)
    for model in ("fraud-scorer", "sentiment"):
        numbers = sorted(ModelVersion.objects.filter(model__name=model)
                         .values_list("version", flat=True))
        tenant = ModelVersion.objects.filter(model__name=model).first().model.tenant.slug
        assert f"`{model}` {words([f'v{n}' for n in numbers])} ({tenant})" in readme
        said = "versions " + words([str(n) for n in numbers]) if len(numbers) > 1 else "version 1"
        assert f"`{model}` ({tenant}, {said}" in operations
    for deployment in Deployment.objects.filter(name__in=["fraud-scorer-prod", "sentiment-prod"]):
        loaded = demo.demo_version(deployment).version
        name = f"`{deployment.model.name}` v{loaded}"
        assert f"{name} on `{deployment.name}`" in readme
        assert f"{name} onto `{deployment.name}`" in operations


def test_the_route_ports_the_docs_name_are_those_the_demo_gives(seeded):
    ports = demo.route_ports()
    assert ports == {"fraud-scorer-prod": settings.SWITCHYARD_ROUTE_PORTS[0],
                     "sentiment-prod": settings.SWITCHYARD_ROUTE_PORTS[1]}
    models = {d.name: d.model.name for d in Deployment.objects.filter(name__in=ports)}
    port_of_model = {models[name]: port for name, port in ports.items()}
    for path in (README, OPERATIONS):
        said = text(path)
        urls = re.findall(r"127\.0\.0\.1:(\d+)/v2/models/([\w-]+)/infer", said)
        assert urls, path.name
        assert {model: int(port) for port, model in urls} == {
            model: port_of_model[model] for _, model in urls}, path.name
        for name, port in re.findall(r"`([\w-]+-prod)`(?: has)? 127\.0\.0\.1:(\d+)", said):
            assert int(port) == ports[name], path.name
    readme = text(README)
    for name, port in ports.items():
        assert f"127.0.0.1:{port}/v2/models/{models[name]}/infer` for `{name}`" in readme


def test_every_console_page_the_docs_name_exists():
    named = {(path.name, page) for path in DOCS
             for page in re.findall(r"`(/[^`\s]*/)`", path.read_text())
             if page.startswith(CONSOLE_PREFIXES)}
    assert ("api.md", "/registry/rollouts/<id>/") in named
    missing = []
    for doc, page in sorted(named):
        try:
            resolve(re.sub(r"<\w+>", "1", page))
        except Resolver404:
            missing.append(f"{doc}: {page}")
    assert missing == []
