"""``deploy/prometheus/slo-rules.yml``: Switchyard's SLO burn-rate rules for Prometheus,
checked with the real ``promtool`` (Debian's ``prometheus`` package; scripts/test installs
it): ``check rules``, ``test rules`` with deploy/prometheus/tests/slo-rules-test.yml (a fast
burn fires and resolves, a slow burn fires alone, a healthy deployment fires nothing, the
latency objective fires from the slow counter, no NaN or Inf), and ``check config`` of the
compose Prometheus that loads them. The rules read only series /metrics exports, and state
the factors Switchyard's own alerts use.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from rollouts.slo.alerts import RULES
from tests.rollouts.workloads.test_autoscaling import make_deployment

ROOT = Path(__file__).resolve().parents[1]
PROMETHEUS = ROOT / "deploy" / "prometheus"
RULE_FILE = PROMETHEUS / "slo-rules.yml"
UNIT_TESTS = PROMETHEUS / "tests" / "slo-rules-test.yml"
TOKEN = "slo-rules-token-0123456789"


def promtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """``promtool args`` run to the end; the test fails, saying how to install it, when
    promtool is missing."""
    binary = shutil.which("promtool") or (
        "/usr/bin/promtool" if Path("/usr/bin/promtool").is_file() else None)
    if binary is None:
        pytest.fail("promtool is not installed: the SLO rules cannot be checked "
                    "(apt-get install -y --no-install-recommends prometheus; scripts/test "
                    "installs it)", pytrace=False)
    return subprocess.run([binary, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def succeeded(done: subprocess.CompletedProcess[str]) -> bool:
    return done.returncode == 0 and "SUCCESS" in done.stdout + done.stderr \
        and "FAILED" not in done.stdout + done.stderr


def rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULE_FILE.read_text())["groups"]
            for rule in group["rules"]]


def alert(name: str) -> dict[str, Any]:
    return next(rule for rule in rules() if rule.get("alert") == name)


def test_promtool_checks_the_rules():
    done = promtool("check", "rules", str(RULE_FILE))

    assert succeeded(done), done.stdout + done.stderr
    assert "16 rules found" in done.stdout


def test_promtool_runs_the_rules_unit_tests():
    """Fast burn (100% errors after an hour of good traffic) fires in minutes and resolves
    after the recovery; slow burn (8x the budget for hours) fires without the fast one; a
    deployment at half its budget fires nothing; slow answers fire the latency objective; a
    deployment without traffic or without budget records no NaN or Inf."""
    done = promtool("test", "rules", UNIT_TESTS.name, cwd=UNIT_TESTS.parent)

    assert succeeded(done), done.stdout + done.stderr


def test_a_failing_unit_test_fails(tmp_path):
    """The check above would see a broken rule: the same unit tests, with the fast burn's
    long-window factor at a tenth, fail and say which alert."""
    broken = RULE_FILE.read_text().replace("ratio_rate1h > 14.4", "ratio_rate1h > 1.44")
    assert broken != RULE_FILE.read_text()
    (tmp_path / "slo-rules.yml").write_text(broken)
    (tmp_path / "tests").mkdir()
    shutil.copy(UNIT_TESTS, tmp_path / "tests" / UNIT_TESTS.name)

    done = promtool("test", "rules", UNIT_TESTS.name, cwd=tmp_path / "tests")

    assert not succeeded(done)
    assert "SwitchyardSLO" in done.stdout + done.stderr


def test_the_compose_prometheus_loads_the_rules(tmp_path):
    """As the compose service lays it out: the config, the rules and the token file side by
    side."""
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    assert config["rule_files"] == ["slo-rules.yml"]
    for name in ("prometheus.yml", "slo-rules.yml"):
        shutil.copy(PROMETHEUS / name, tmp_path / name)
    (tmp_path / "metrics-token").write_text("a-token")
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert "/etc/switchyard-prometheus/slo-rules.yml" in compose["services"]["prometheus"]["command"][0]

    done = promtool("check", "config", str(tmp_path / "prometheus.yml"))

    assert succeeded(done), done.stdout + done.stderr
    assert "1 rule files found" in done.stdout


def test_the_alerts_follow_the_series_they_read_in_one_group():
    """Prometheus evaluates a group's rules in order but groups in no set order: in one
    group, after the recording rules, an alert reads the burn rates of its own evaluation."""
    groups = yaml.safe_load(RULE_FILE.read_text())["groups"]

    assert len(groups) == 1
    kinds = ["alert" if "alert" in rule else "record" for rule in groups[0]["rules"]]
    assert kinds == sorted(kinds, key=lambda kind: kind == "alert")
    assert kinds.count("alert") == 2


def test_the_alerts_use_switchyards_own_factors_and_page():
    factors = {rule.long: rule.factor for rule in RULES} | {rule.short: rule.factor for rule in RULES}
    fast, slow = alert("SwitchyardSLOFastBurn"), alert("SwitchyardSLOSlowBurn")

    assert re.findall(r"ratio_rate(\w+) > ([\d.]+)", fast["expr"]) == [
        ("1h", str(factors["1h"])), ("5m", str(factors["5m"]))]
    assert re.findall(r"ratio_rate(\w+) > ([\d.]+)", slow["expr"])[:2] == [
        ("6h", f"{factors['6h']:g}"), ("30m", f"{factors['30m']:g}")]
    for rule in (fast, slow):
        assert rule["labels"] == {"severity": "page"}
        assert set(rule["annotations"]) == {"summary", "description"}


@pytest.mark.django_db
def test_the_rules_read_only_series_metrics_exports(settings):
    settings.SWITCHYARD_METRICS_TOKEN = TOKEN
    settings.SWITCHYARD_METRICS_ALLOW_NETS = []
    make_deployment()
    answer = Client().get("/metrics", REMOTE_ADDR="127.0.0.1",
                          HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    exported = {sample.name for family in text_string_to_metric_families(answer.content.decode())
                for sample in family.samples}

    read = {name for rule in rules() for name in re.findall(r"\bswitchyard_\w+", rule["expr"])}

    assert read == {
        "switchyard_deployment_requests_total", "switchyard_deployment_failed_requests_total",
        "switchyard_deployment_slow_requests_total", "switchyard_deployment_slo_error_ratio",
        "switchyard_deployment_slo_latency_objective_ratio"}
    assert read <= exported
