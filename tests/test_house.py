"""The map of the house (docs/architecture.md), checked so it stays true: rooms by noun, small
modules, imports that run one way and close no circle."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT_APPS = ("console", "fleet", "rollouts")
MAX_LINES = 600
# What may sit directly in an app's package besides its rooms (sub-packages) and the Django
# files every app has; anything else belongs in a room.
TOP_LEVEL = {
    "fleet": {"audit", "webhooks"},
    "rollouts": {"leases", "idempotency"},
}
DJANGO_FILES = {"__init__", "apps", "admin", "tasks", "urls"}
# console is the project package: its shared modules (the Celery app, logs, settings, the base
# classes of the API and of forms, telemetry) serve every app and so import none; these few
# join the apps together, and only they may import them.
CONSOLE_CROSS_APP = {"console.urls", "console.views", "console.metrics", "console.context_processors"}


def _parse(path: Path) -> ast.Module:
    source = path.read_text()
    try:
        return ast.parse(source, filename=str(path))
    except SystemError:  # see tests/test_layout.py: a shared recursion counter in 3.11
        return ast.parse(source, filename=str(path))


def product_modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for app in PRODUCT_APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if "migrations" in parts:
                continue
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(child) for child in ast.walk(node))
    return skipped


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The product modules ``module`` imports when it runs, at any depth (an import inside a
    function counts: it hides a circle, it does not remove it); imports only for type checkers
    do not run and do not count."""
    tree = _parse(path)
    skipped = _type_checking_nodes(tree)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            parts = base.split(".")
            found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
            found.update(f"{base}.{alias.name}" for alias in node.names)
    # A module's own packages are already importing when it runs (Python imports a package
    # before its modules), so an edge to them is no circle of the code's making.
    ancestors = {".".join(package[:i]) for i in range(1, len(package) + 1)}
    return {name for name in found if name in modules and name != module and name not in ancestors}


def import_graph() -> dict[str, set[str]]:
    modules = product_modules()
    return {module: imports_of(module, path, modules) for module, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:
        work = [(node, iter(sorted(graph[node])))]
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        while work:
            current, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[current] = min(low[current], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[current])
                if low[current] == index[current]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == current:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle_among_product_modules():
    assert circles(import_graph()) == []


def test_the_circle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]


def test_no_product_module_passes_600_lines():
    long = {
        module: n
        for module, path in product_modules().items()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_apps_keep_their_modules_in_rooms():
    loose = []
    for app, allowed in TOP_LEVEL.items():
        for path in (ROOT / app).glob("*.py"):
            if path.stem not in DJANGO_FILES | allowed:
                loose.append(path.relative_to(ROOT).as_posix())
    assert sorted(loose) == []


def test_console_shared_modules_import_no_app():
    graph = import_graph()
    offenders = {
        module: sorted(name for name in imported if not name.startswith("console"))
        for module, imported in graph.items()
        if module.startswith("console") and module not in CONSOLE_CROSS_APP
    }
    assert {module: names for module, names in offenders.items() if names} == {}


def test_fleet_imports_nothing_from_rollouts_at_any_depth():
    offenders = {
        module: sorted(name for name in imported if name.startswith("rollouts"))
        for module, imported in import_graph().items()
        if module.startswith("fleet")
    }
    assert {module: names for module, names in offenders.items() if names} == {}


def test_no_product_module_imports_the_local_app():
    offenders = []
    for module, path in product_modules().items():
        for node in ast.walk(_parse(path)):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            offenders += [f"{module}:{node.lineno} imports {n}" for n in names
                          if n == "local" or n.startswith("local.")]
    assert offenders == []


def test_tests_mirror_the_rooms():
    """Each room of an app has its tests in the same place under tests/ (the API of every room
    is tested together in tests/api/, its matrices of personas and hostile input being one)."""
    missing = []
    for app in ("fleet", "rollouts"):
        for room in sorted(p for p in (ROOT / app).iterdir() if (p / "__init__.py").is_file()):
            if room.name in ("migrations", "management", "templatetags", "models", "api"):
                continue
            if not (ROOT / "tests" / app / room.name).is_dir():
                missing.append(f"tests/{app}/{room.name}/")
    assert missing == []


def test_no_view_module_imports_another():
    """Views draw what several rooms share from a room's pages module (for example
    rollouts/deployments/pages.py), never from another view module."""
    offenders = {
        module: sorted(name for name in imported if name.endswith(".views"))
        for module, imported in import_graph().items()
        if module.endswith(".views")
    }
    assert {module: names for module, names in offenders.items() if names} == {}


def test_the_image_carries_every_app_the_settings_install():
    """The Docker image copies each of the project's own packages that INSTALLED_APPS names
    (the settings import them all at start-up, so a missing one is an image that never
    starts)."""
    from django.conf import settings

    copied = {
        line.split()[1].rstrip("/")
        for line in (ROOT / "Dockerfile").read_text().splitlines()
        if line.startswith("COPY ")
    }
    ours = {app.split(".")[0] for app in settings.INSTALLED_APPS if (ROOT / app.split(".")[0]).is_dir()}
    assert ours == {"console", "fleet", "rollouts", "local"}
    assert ours - copied == set()
