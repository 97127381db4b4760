"""How the top-level packages depend on each other, and what the daemon loads.

Imports flow one way: cli -> toolbox -> api -> procedures -> metasrv (the core). The daemon
(`metasrv`, `procedures`, `api`) never imports the development tools or the CLI, so
`metasrv start` loads neither the simulator, the local stack nor PySpark.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.toolbox.simulator._metasrv import settings, start_metasrv
from toolbox.simulator import free_port

ROOT = Path(__file__).resolve().parent.parent
# Higher imports lower, never the other way.
LAYERS = {"cli": 4, "toolbox": 3, "api": 2, "procedures": 1, "metasrv": 0}


def _imported_packages(path: Path) -> set[str]:
    """Top-level project packages a module imports, lazily or not (TYPE_CHECKING included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found.update(name.split(".")[0] for name in names if name.split(".")[0] in LAYERS)
    return found


def package_edges() -> dict[tuple[str, str], list[str]]:
    """(importer, imported) -> the modules that make that edge."""
    edges: dict[tuple[str, str], list[str]] = {}
    for package in LAYERS:
        for path in sorted((ROOT / package).rglob("*.py")):
            for imported in _imported_packages(path) - {package}:
                edges.setdefault((package, imported), []).append(str(path.relative_to(ROOT)))
    return edges


def test_imports_flow_one_way() -> None:
    edges = package_edges()
    upward = {f"{a} -> {b}": modules for (a, b), modules in edges.items() if LAYERS[a] <= LAYERS[b]}
    assert upward == {}, f"imports against the layering {list(LAYERS)}: {upward}"
    # The scan sees real edges (a scan that found nothing would pass the check above).
    assert ("cli", "api") in edges and ("api", "procedures") in edges
    assert ("procedures", "metasrv") in edges and ("toolbox", "metasrv") in edges


def test_the_scan_catches_an_upward_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from toolbox.stack import ensure_up\n")
    assert _imported_packages(module) == {"toolbox"}


def _imported_modules(importtime_log: str) -> set[str]:
    """Module names from `-X importtime` lines: `import time: self | cumulative | name`."""
    names = set()
    for line in importtime_log.splitlines():
        if line.startswith("import time:") and line.count("|") == 2:
            names.add(line.rsplit("|", 1)[1].strip())
    return names


@pytest.mark.timeout(120)
def test_metasrv_start_loads_no_tools_and_no_spark(
    kafka_bootstrap: str, unique_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kv = {"backend": "sql", "sql_url": f"sqlite:///{tmp_path / 'kv.db'}"}
    sections = settings(
        unique_prefix, kafka_bootstrap, free_port(), kv, f"sqlite:///{tmp_path / 'h.db'}"
    )
    proc = start_metasrv(tmp_path, "metasrv", sections)
    monkeypatch.setenv("PYTHONPROFILEIMPORTTIME", "1")  # the child logs every import
    with proc:
        pass  # up, elected leader, serving: everything startup loads is loaded
    loaded = _imported_modules(proc.log_path.read_text())
    assert {"cli._daemon", "api.runtime", "procedures"} <= loaded, "importtime log not read"
    tools = sorted(m for m in loaded if m.split(".")[0] in {"toolbox", "pyspark", "py4j"})
    assert tools == []
