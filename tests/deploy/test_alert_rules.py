"""deploy/prometheus/alerts.yml: promtool's unit tests (alerts_test.yml) pass, every alert has
cases that fire it and cases that must not, and every alert carries a runbook naming real
`metasrv` commands. The rules in a running server: test_monitoring.py."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from cli import app
from tests.deploy.conftest import ALERT_RULES, DEPLOY

RULE_TESTS = DEPLOY / "prometheus" / "alerts_test.yml"
SEVERITIES = {"critical", "warning"}


def _alerts() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERT_RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"] if "alert" in rule]


def _promtool(promtool: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ALERT_RULES.parent,
    )


def test_promtool_checks_the_rules_and_the_example_config(promtool: str) -> None:
    for args in (("check", "rules", ALERT_RULES), ("check", "config", "prometheus.yml")):
        done = _promtool(promtool, *args)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "SUCCESS" in done.stdout + done.stderr


def test_promtool_unit_tests_pass(promtool: str) -> None:
    done = _promtool(promtool, "test", "rules", RULE_TESTS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_alert_has_cases_that_fire_it_and_cases_that_must_not() -> None:
    names = {rule["alert"] for rule in _alerts()}
    fires: set[str] = set()
    quiet: set[str] = set()
    for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            assert check["alertname"] in names, f"{case['name']}: unknown {check['alertname']}"
            (fires if check.get("exp_alerts") else quiet).add(check["alertname"])
    assert fires == names, f"never shown firing: {sorted(names - fires)}"
    assert quiet == names, f"never shown quiet: {sorted(names - quiet)}"


def test_no_leader_is_tested_with_every_replica_down() -> None:
    """A case where every replica's last scrape failed (stale) expects MetasrvNoLeader firing."""
    found = []
    for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        leaders = [s for s in case["input_series"] if s["series"].startswith("metasrv_is_leader")]
        if leaders and all(s["values"].split()[-1] == "stale" for s in leaders):
            found += [
                check
                for check in case.get("alert_rule_test", [])
                if check["alertname"] == "MetasrvNoLeader" and check.get("exp_alerts")
            ]
    assert found, "no MetasrvNoLeader case with every replica down"


def test_every_alert_says_what_to_do() -> None:
    for rule in _alerts():
        name, annotations = rule["alert"], rule.get("annotations", {})
        assert rule.get("labels", {}).get("severity") in SEVERITIES, name
        for key in ("summary", "description", "runbook"):
            assert annotations.get(key), f"{name} has no {key}"
        assert "`metasrv " in annotations["runbook"], f"{name}: runbook names no metasrv command"


def test_runbook_commands_exist() -> None:
    """Every `metasrv ...` command a runbook names parses, options included."""
    runner = CliRunner()
    commands = {
        re.sub(r"\{\{.*?\}\}", "X", span)
        for rule in _alerts()
        for span in re.findall(r"`(metasrv [^`]+)`", rule["annotations"]["runbook"])
    }
    assert len(commands) >= 5
    for command in sorted(commands):
        result = runner.invoke(app, [*shlex.split(command)[1:], "--help"])
        assert result.exit_code == 0, f"{command}: {result.output}"


def test_deploy_readme_explains_every_alert() -> None:
    readme = (DEPLOY / "README.md").read_text()
    section = readme.split("\n## Alerts\n", 1)
    assert len(section) == 2, "deploy/README.md has no '## Alerts' section"
    body = section[1].split("\n## ", 1)[0]
    missing = [rule["alert"] for rule in _alerts() if rule["alert"] not in body]
    assert not missing, f"deploy/README.md's Alerts section does not explain {missing}"
