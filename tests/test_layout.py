"""The layout rules of the project, checked so they stay true."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


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
