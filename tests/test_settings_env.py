"""Settings from the environment: console.env readers fail loudly naming the variable, and
production mode passes ``manage.py check --deploy`` only when configured."""

from __future__ import annotations

import os
import secrets
import string
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from console.env import env_bool, env_float, env_int, env_list, env_secret

REPO_ROOT = Path(__file__).resolve().parents[1]
VAR = "SWITCHYARD_TEST_SETTING"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in (VAR, f"{VAR}_FILE"):
        monkeypatch.delenv(name, raising=False)


# --- env_bool ------------------------------------------------------------------------------------


@pytest.mark.parametrize("raw", ["1", "true", "TRUE", " yes ", "on"])
def test_env_bool_reads_true(monkeypatch, raw):
    monkeypatch.setenv(VAR, raw)
    assert env_bool(VAR) is True


@pytest.mark.parametrize("raw", ["0", "false", "No", "off", ""])
def test_env_bool_reads_false(monkeypatch, raw):
    monkeypatch.setenv(VAR, raw)
    assert env_bool(VAR, default=True) is False


def test_env_bool_falls_back_to_the_default_when_unset():
    assert env_bool(VAR, default=True) is True
    assert env_bool(VAR) is False


@pytest.mark.parametrize("raw", ["maybe", "2", "truee", "enabled"])
def test_env_bool_refuses_anything_else_naming_the_variable(monkeypatch, raw):
    monkeypatch.setenv(VAR, raw)

    with pytest.raises(ImproperlyConfigured) as refused:
        env_bool(VAR)

    assert VAR in str(refused.value)
    assert repr(raw) in str(refused.value)


# --- env_int / env_float ---------------------------------------------------------------------------


def test_env_int_reads_an_integer_or_the_default(monkeypatch):
    assert env_int(VAR, 7) == 7
    monkeypatch.setenv(VAR, "")
    assert env_int(VAR, 7) == 7
    monkeypatch.setenv(VAR, " 42 ")
    assert env_int(VAR, 7) == 42


@pytest.mark.parametrize("raw", ["ten", "1.5", "0x10", "4 2"])
def test_env_int_refuses_a_non_integer_naming_the_variable(monkeypatch, raw):
    monkeypatch.setenv(VAR, raw)

    with pytest.raises(ImproperlyConfigured) as refused:
        env_int(VAR, 7)

    assert str(refused.value) == f"{VAR} must be an integer, got {raw!r}"


def test_env_int_refuses_a_value_below_the_minimum_naming_the_variable(monkeypatch):
    monkeypatch.setenv(VAR, "-1")

    with pytest.raises(ImproperlyConfigured) as refused:
        env_int(VAR, 7, minimum=0)

    assert str(refused.value) == f"{VAR} must be at least 0, got -1"


def test_env_float_reads_a_number_or_the_default(monkeypatch):
    assert env_float(VAR, 2.5) == 2.5
    monkeypatch.setenv(VAR, "0.25")
    assert env_float(VAR, 2.5) == 0.25


@pytest.mark.parametrize("raw", ["fast", "1,5", "2s"])
def test_env_float_refuses_a_non_number_naming_the_variable(monkeypatch, raw):
    monkeypatch.setenv(VAR, raw)

    with pytest.raises(ImproperlyConfigured) as refused:
        env_float(VAR, 1.0)

    assert str(refused.value) == f"{VAR} must be a number, got {raw!r}"


def test_env_float_refuses_a_value_below_the_minimum_naming_the_variable(monkeypatch):
    monkeypatch.setenv(VAR, "0.05")

    with pytest.raises(ImproperlyConfigured) as refused:
        env_float(VAR, 1.0, minimum=0.1)

    assert VAR in str(refused.value)
    assert "at least 0.1" in str(refused.value)


def test_env_list_splits_on_commas_and_drops_blanks(monkeypatch):
    assert env_list(VAR, ["a"]) == ["a"]
    monkeypatch.setenv(VAR, " a.example.com, ,b.example.com,")
    assert env_list(VAR, []) == ["a.example.com", "b.example.com"]


# --- env_secret -------------------------------------------------------------------------------------


def test_env_secret_reads_the_variable_or_the_default(monkeypatch):
    assert env_secret(VAR) is None
    assert env_secret(VAR, "fallback") == "fallback"
    monkeypatch.setenv(VAR, "s3cret")
    assert env_secret(VAR) == "s3cret"


def test_env_secret_reads_the_file_named_by_NAME_FILE_and_prefers_it(monkeypatch, tmp_path):
    secret_file = tmp_path / "secret"
    secret_file.write_text("from-the-file\n")
    monkeypatch.setenv(VAR, "from-the-variable")
    monkeypatch.setenv(f"{VAR}_FILE", str(secret_file))

    assert env_secret(VAR) == "from-the-file"


def test_env_secret_refuses_an_unreadable_file_naming_NAME_FILE(monkeypatch, tmp_path):
    missing = tmp_path / "nope"
    monkeypatch.setenv(f"{VAR}_FILE", str(missing))

    with pytest.raises(ImproperlyConfigured) as refused:
        env_secret(VAR)

    assert str(refused.value).startswith(f"{VAR}_FILE points at {missing}, which cannot be read")


# --- production mode, in a fresh process -------------------------------------------------------------

HOST = "switchyard.example.com"


def random_key(length: int = 60) -> str:
    alphabet = string.ascii_letters + string.digits + "!@#%^&*(-_=+)"
    return "".join(secrets.choice(alphabet) for _ in range(length))


def manage(*args: str, **env: str | None) -> subprocess.CompletedProcess[str]:
    """Run manage.py in a subprocess with the test environment changed by ``env``
    (None removes a variable)."""
    environ = dict(os.environ)
    for name in ("SECRET_KEY", "SECRET_KEY_FILE", "SWITCHYARD_DEBUG", "SWITCHYARD_ALLOWED_HOSTS",
                 "SWITCHYARD_PRODUCTION"):
        environ.pop(name, None)
    for name, value in env.items():
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=REPO_ROOT, env=environ,
        capture_output=True, text=True, timeout=120, check=False,
    )


def deploy_check(**env: str | None) -> subprocess.CompletedProcess[str]:
    return manage("check", "--deploy", "--fail-level", "WARNING", **env)


def test_production_mode_passes_the_deploy_checks():
    result = deploy_check(SWITCHYARD_PRODUCTION="true", SECRET_KEY=random_key(),
                          SWITCHYARD_ALLOWED_HOSTS=HOST)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


def test_production_mode_reads_the_secret_key_from_a_file(tmp_path):
    key_file = tmp_path / "secret_key"
    key_file.write_text(random_key() + "\n")

    result = deploy_check(SWITCHYARD_PRODUCTION="true", SECRET_KEY_FILE=str(key_file),
                          SWITCHYARD_ALLOWED_HOSTS=HOST)

    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"SWITCHYARD_ALLOWED_HOSTS": HOST}, "SECRET_KEY"),
        ({"SWITCHYARD_ALLOWED_HOSTS": HOST, "SECRET_KEY": "short"}, "SECRET_KEY must be at least 50"),
        ({"SECRET_KEY": "<random>"}, "SWITCHYARD_ALLOWED_HOSTS"),
        ({"SECRET_KEY": "<random>", "SWITCHYARD_ALLOWED_HOSTS": HOST, "SWITCHYARD_DEBUG": "true"},
         "SWITCHYARD_DEBUG"),
        ({"SECRET_KEY": "<random>", "SWITCHYARD_ALLOWED_HOSTS": HOST,
          "SWITCHYARD_HSTS_SECONDS": "a year"}, "SWITCHYARD_HSTS_SECONDS"),
    ],
    ids=["no-secret-key", "short-secret-key", "no-allowed-hosts", "debug-on", "bad-hsts"],
)
def test_production_mode_refuses_to_start_misconfigured_naming_the_variable(env, named):
    env = {name: random_key() if value == "<random>" else value for name, value in env.items()}

    result = deploy_check(SWITCHYARD_PRODUCTION="true", **env)

    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert named in result.stderr


def test_a_malformed_boolean_stops_manage_py_naming_the_variable():
    result = manage("check", SWITCHYARD_PRODUCTION="perhaps")

    assert result.returncode != 0
    assert "SWITCHYARD_PRODUCTION must be a boolean" in result.stderr
