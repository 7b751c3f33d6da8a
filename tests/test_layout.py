"""The layout rules of the project, checked so they stay true."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT_APPS = ("fleet", "rollouts", "console")
# The modules allowed to run servers on this host, and why. Everything else must work for any
# server, wherever it runs, through the adapters that fleet/runtimes.py picks.
LOCAL_RUNTIME_USERS = {
    "fleet/local_cluster.py": "the local cluster: starts the demo's Triton and vLLM here",
    "fleet/adapters/vllm_roll.py": "rolls the vLLM process of a local-cluster server",
    "rollouts/demo.py": "the demo's seed data (its model folders and LoRA adapters)",
}
LOCAL_CLUSTER_USERS = {
    "fleet/management/commands/local_cluster.py": "`manage.py local_cluster up|down|status`",
    "rollouts/demo.py": "the demo's seed data registers the local cluster",
}


def _parse(path: Path) -> ast.Module:
    """``path``'s syntax tree. Python 3.11 keeps one recursion counter for all threads while it
    builds a tree, so a traceback formatted in another thread of the test session (it parses
    source to place its carets) can make this parse fail with a SystemError that says nothing
    about the file; a second try is then exact."""
    source = path.read_text()
    try:
        return ast.parse(source, filename=str(path))
    except SystemError:
        return ast.parse(source, filename=str(path))


def _imported_modules(path: Path) -> set[str]:
    tree = _parse(path)
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _all_imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth (function-level imports included); for
    ``from a import b`` both ``a`` and ``a.b`` (b may be a module)."""
    names: set[str] = set()
    for node in ast.walk(_parse(path)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _importers(is_wanted) -> set[str]:
    """Product modules (outside fleet/runtime/ itself) that import a module ``is_wanted``."""
    found = set()
    for app in PRODUCT_APPS:
        for path in (ROOT / app).rglob("*.py"):
            rel = path.relative_to(ROOT).as_posix()
            if not rel.startswith("fleet/runtime/") and any(map(is_wanted, _all_imports(path))):
                found.add(rel)
    return found


def _is_local_runtime(name: str) -> bool:
    return name == "fleet.runtime" or name.startswith("fleet.runtime.")


def _is_local_cluster(name: str) -> bool:
    return name == "fleet.local_cluster"


def test_only_the_local_cluster_and_the_demo_start_servers_on_this_host():
    assert _importers(_is_local_runtime) <= set(LOCAL_RUNTIME_USERS)
    assert all((ROOT / rel).is_file() for rel in LOCAL_RUNTIME_USERS)


def test_only_its_command_and_the_demo_use_the_local_cluster():
    assert _importers(_is_local_cluster) <= set(LOCAL_CLUSTER_USERS)


def test_the_adapter_picker_imports_neither_the_local_cluster_nor_a_local_runtime():
    imported = _all_imports(ROOT / "fleet" / "runtimes.py")
    assert {n for n in imported if _is_local_cluster(n) or _is_local_runtime(n)} == set()


def test_serving_the_product_loads_no_local_runtime():
    """The web app's URLs, the worker's tasks and the adapter picker, imported in a fresh
    interpreter, bring in neither the local cluster nor a local runtime."""
    code = (
        "import sys, django; django.setup()\n"
        "import console.urls, console.celery, fleet.tasks, rollouts.tasks, fleet.runtimes\n"
        "from django.urls import get_resolver; get_resolver().url_patterns\n"
        "print(sorted(m for m in sys.modules if m == 'fleet.local_cluster'"
        " or m == 'fleet.runtime' or m.startswith('fleet.runtime.')))\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "console.settings"}
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_fleet_never_imports_rollouts():
    offenders = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in (ROOT / "fleet").rglob("*.py")
        for name in _imported_modules(path)
        if name == "rollouts" or name.startswith("rollouts.")
    ]
    assert offenders == []


def test_every_model_has_a_docstring():
    from django.apps import apps

    missing = [
        model.__name__
        for app in ("fleet", "rollouts")
        for model in apps.get_app_config(app).get_models()
        if not (model.__doc__ or "").strip() or model.__doc__.startswith(model.__name__ + "(")
    ]
    assert missing == []


def test_migrations_are_complete(db):
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("makemigrations", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()
