"""The layout rules of the project, checked so they stay true."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT_APPS = ("fleet", "rollouts", "console")
# No product module runs servers on this host: every one works for any server, wherever it
# runs, through the adapters that fleet/inventory/runtimes.py picks. What the local app runs
# plugs in from its side (local/apps.py registers the local cluster's vLLM roller).
LOCAL_CLUSTER_USERS: dict[str, str] = {}


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
    """Product modules that import a module ``is_wanted``."""
    found = set()
    for app in PRODUCT_APPS:
        for path in (ROOT / app).rglob("*.py"):
            rel = path.relative_to(ROOT).as_posix()
            if any(map(is_wanted, _all_imports(path))):
                found.add(rel)
    return found


def _is_local_runtime(name: str) -> bool:
    return name == "local" or name.startswith("local.")


def _is_local_cluster(name: str) -> bool:
    return name == "local.cluster"


def test_no_product_module_imports_the_local_app():
    """Not even inside a function: the local app plugs into the product, never the reverse."""
    assert _importers(_is_local_runtime) == set()


def test_the_local_app_registers_its_vllm_roller():
    from fleet.inventory.runtimes import base_model_roller
    from fleet.models import Cluster
    from local.vllm_roll import roll_runtime_for

    assert base_model_roller(Cluster.Kind.LOCAL) is roll_runtime_for
    assert base_model_roller(Cluster.Kind.STATIC) is None


def test_only_its_command_and_the_demo_use_the_local_cluster():
    assert _importers(_is_local_cluster) <= set(LOCAL_CLUSTER_USERS)


def test_the_adapter_picker_imports_neither_the_local_cluster_nor_a_local_runtime():
    imported = _all_imports(ROOT / "fleet" / "inventory" / "runtimes.py")
    assert {n for n in imported if _is_local_cluster(n) or _is_local_runtime(n)} == set()


def test_serving_the_product_loads_no_local_runtime():
    """The web app's URLs, the worker's tasks and the adapter picker, imported in a fresh
    interpreter, bring in neither the local cluster nor a local runtime."""
    code = (
        "import sys, django; django.setup()\n"
        "import console.urls, console.celery, fleet.tasks, rollouts.tasks, fleet.inventory.runtimes\n"
        "from django.urls import get_resolver; get_resolver().url_patterns\n"
        "print(sorted(m for m in sys.modules if m.startswith('local.') and m != 'local.apps'))\n"
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


# --------------------------------------------------------------------------------------------
# Imports run one way (tasks -> domain), and a module's private names stay its own
# --------------------------------------------------------------------------------------------


def _product_modules() -> dict[str, Path]:
    """Every product module by its dotted name (migrations left out)."""
    found: dict[str, Path] = {}
    for app in PRODUCT_APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if "migrations" in parts:
                continue
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _from_module(node: ast.ImportFrom, module: str, path: Path) -> str:
    """The module ``from … import`` names in ``module`` (at ``path``), a relative one resolved."""
    if node.level == 0:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    return ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))


def _is_task_module(name: str) -> bool:
    return name.split(".")[0] in PRODUCT_APPS and name.rsplit(".", 1)[-1] == "tasks"


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _dotted(node: ast.expr) -> str:
    """``a.b.c`` for an attribute chain on a name; "" for anything else."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else ""


def test_no_module_but_a_task_module_imports_a_task_module():
    """Domain modules, views and the API send their tasks by name after the commit
    (``console.celery.send_soon`` / ``send_now``); only task modules import task modules,
    at any depth (an import inside a function hides a circle, it does not remove it)."""
    offenders = []
    for module, path in _product_modules().items():
        if _is_task_module(module):
            continue
        for node in ast.walk(_parse(path)):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _from_module(node, module, path)
                names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            else:
                continue
            offenders += [f"{module}:{node.lineno} imports {n}" for n in names if _is_task_module(n)]
    assert offenders == []


def test_every_task_sent_by_name_is_a_task():
    """A task sent by name (``send_soon("rollouts.tasks.advance_load", pk)``) names a task the
    workers have: a misspelt name would be published and never run."""
    import fleet.tasks  # noqa: F401 (registers the fleet's tasks)
    import rollouts.tasks  # noqa: F401 (registers the rollouts' tasks)
    from console.celery import app

    sent = {
        f"{module}:{node.lineno}": node.args[0].value
        for module, path in _product_modules().items()
        for node in ast.walk(_parse(path))
        if isinstance(node, ast.Call) and _dotted(node.func).rsplit(".", 1)[-1] in ("send_now", "send_soon")
        and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
    }
    assert "rollouts.tasks.advance_load" in sent.values()
    assert {where: name for where, name in sent.items() if name not in app.tasks} == {}


def test_no_private_name_crosses_a_module():
    """A name that starts with ``_`` is its module's own: no other product module imports it
    (``from rollouts.workloads.requests import _range_words``) or reaches it through the module
    (``routes._set_route``); what another module needs gets a public name that says what it is."""
    modules = _product_modules()
    offenders = []
    for module, path in modules.items():
        tree = _parse(path)
        bound: dict[str, str] = {}  # a name in this module -> the product module it stands for
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname and alias.name in modules:
                        bound[alias.asname] = alias.name
                    elif not alias.asname and alias.name.split(".")[0] in modules:
                        bound[alias.name.split(".")[0]] = alias.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom):
                base = _from_module(node, module, path)
                for alias in node.names:
                    if _is_private(alias.name) and base != module and base.split(".")[0] in PRODUCT_APPS:
                        offenders.append(f"{module}:{node.lineno} imports {base}.{alias.name}")
                    elif f"{base}.{alias.name}" in modules:
                        bound[alias.asname or alias.name] = f"{base}.{alias.name}"
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not _is_private(node.attr):
                continue
            head, _, rest = _dotted(node.value).partition(".")
            owner = ".".join(filter(None, [bound.get(head, ""), rest]))
            if head in bound and owner in modules and owner != module:
                offenders.append(f"{module}:{node.lineno} uses {owner}.{node.attr}")
    assert offenders == []
