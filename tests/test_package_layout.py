"""How the packages depend on each other, what each shows the others, and what the daemon loads.

- Between the top-level packages, imports flow one way: cli -> toolbox -> api -> procedures ->
  metasrv (the core). The daemon (`metasrv`, `procedures`, `api`) never imports the development
  tools or the CLI, so `metasrv start` loads neither the simulator, the local stack nor PySpark.
- Inside `metasrv/`, each sub-package or plain module imports only from the layers below it:
  plain modules (errors, keys, model, metrics, settings, sql) <- adapters (process, wire, kafka,
  kv) <- election, datanode (the client a database embeds) <- leader <- stat_history <-
  reconcile. Plain modules may import each other; nothing else imports sideways.
- Outside a package, nothing imports its private modules or names (`metasrv.kv._sql`,
  `from metasrv.kafka import _x`, a `monkeypatch.setattr("pkg._mod.NAME", ...)` target): only
  what its `__init__` exports. A sub-package is outside its parent (`procedures.wal_purge`
  imports `procedures`' public names); `tests/` and `benchmarks/` are outside every package.
- No module imports itself back through others (an import circle), counting every import:
  lazy ones and those only for type checking (`if TYPE_CHECKING:`), since a module that
  needs a type from the module that builds it is the same knot.

Modules are sized by what they represent, not by a line count (STYLE.md).
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

from tests._source import nodes
from tests.toolbox.simulator._metasrv import settings, start_metasrv
from toolbox.simulator import free_port

ROOT = Path(__file__).resolve().parent.parent
# Higher imports lower, never the other way.
LAYERS = {"cli": 4, "toolbox": 3, "api": 2, "procedures": 1, "metasrv": 0}


def _package_of(path: Path, root: Path) -> str:
    """Dotted package a module belongs to (`metasrv/kv/_sql.py` -> `metasrv.kv`)."""
    return ".".join(path.parent.relative_to(root).parts)


@functools.cache
def _imports(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, dotted target) of every import in a module, lazy ones included, relative ones made
    absolute: `import a.b` -> `a.b`, `from a import b` -> `a.b`. String targets of
    `monkeypatch.setattr`, `delattr`, `import_module` and `patch` count as imports too."""
    package = _package_of(path, root).split(".")
    found: list[tuple[int, str]] = []
    for node in nodes(path):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            found.extend((node.lineno, f"{module}.{alias.name}") for alias in node.names)
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            first = node.args[0]
            if (
                name in {"setattr", "delattr", "import_module", "patch"}
                and isinstance(first, ast.Constant)
                and isinstance(first.value, str)
                and first.value.split(".")[0] in LAYERS
            ):
                found.append((node.lineno, first.value))
    return found


def _imported_packages(path: Path, root: Path = ROOT) -> set[str]:
    """Top-level project packages a module imports, lazily or not (TYPE_CHECKING included)."""
    return {target.split(".")[0] for _, target in _imports(path, root)} & set(LAYERS)


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
    assert _imported_packages(module, tmp_path) == {"toolbox"}


# -- inside metasrv/ -------------------------------------------------------------------------------

METASRV_LAYERS: list[frozenset[str]] = [
    frozenset({"errors", "keys", "model", "metrics", "settings", "sql"}),  # plain modules
    frozenset({"process", "wire", "kafka", "kv", "archive"}),  # adapters
    frozenset({"election", "datanode"}),  # datanode: the client a database embeds
    frozenset({"leader"}),
    frozenset({"stat_history"}),
    frozenset({"reconcile"}),
]
"""Lowest first. A unit imports from lower layers only; plain modules may import each other."""
_RANK = {unit: rank for rank, units in enumerate(METASRV_LAYERS) for unit in units}


def _metasrv_unit(dotted: str) -> str:
    """`metasrv.leader._heartbeat.X` -> `leader`; `metasrv.keys` -> `keys`."""
    return dotted.split(".")[1] if dotted.count(".") else ""


def metasrv_units(root: Path = ROOT) -> set[str]:
    """The sub-packages and plain modules directly under metasrv/."""
    base = root / "metasrv"
    packages = {p.parent.name for p in base.glob("*/*.py")}
    modules = {p.stem for p in base.glob("*.py") if p.name != "__init__.py"}
    return packages | modules


def metasrv_edges(root: Path = ROOT) -> dict[tuple[str, str], set[str]]:
    """(importer unit, imported unit) -> the modules that make that edge, inside metasrv/.
    metasrv/__init__.py, the package's face, re-exports and is not a unit."""
    edges: dict[tuple[str, str], set[str]] = {}
    for path in sorted((root / "metasrv").rglob("*.py")):
        rel = path.relative_to(root / "metasrv")
        if rel == Path("__init__.py"):
            continue
        importer = rel.parts[0].removesuffix(".py")
        for _, target in _imports(path, root):
            if target.split(".")[0] != "metasrv":
                continue
            imported = _metasrv_unit(target)
            if imported != importer:
                edges.setdefault((importer, imported), set()).add(str(path.relative_to(root)))
    return edges


def layering_violations(edges: dict[tuple[str, str], set[str]]) -> dict[str, set[str]]:
    """Edges that go up or sideways (or to a unit the layers do not place)."""
    bad: dict[str, set[str]] = {}
    for (importer, imported), modules in edges.items():
        low, high = _RANK.get(imported), _RANK.get(importer)
        if low is None or high is None or low > high or (low == high and low != 0):
            bad[f"{importer} -> {imported}"] = modules
    return bad


def test_every_metasrv_unit_has_a_layer() -> None:
    assert metasrv_units() == set(_RANK), "place every sub-package of metasrv/ in METASRV_LAYERS"


def test_metasrv_imports_flow_down_its_layers() -> None:
    edges = metasrv_edges()
    assert layering_violations(edges) == {}, f"against {[sorted(u) for u in METASRV_LAYERS]}"
    # The scan sees real edges across every layer boundary.
    assert {("kv", "errors"), ("election", "kv"), ("leader", "kafka")} <= set(edges)
    assert {("stat_history", "leader"), ("reconcile", "stat_history")} <= set(edges)


def test_the_metasrv_scan_catches_upward_and_sideways_imports(tmp_path: Path) -> None:
    (tmp_path / "metasrv" / "kv").mkdir(parents=True)
    (tmp_path / "metasrv" / "kv" / "_x.py").write_text(
        "from metasrv.leader import Checkpointer\nfrom .. import kafka\n"
        "def f():\n    from metasrv.errors import MetasrvError\n"
    )
    (tmp_path / "metasrv" / "keys.py").write_text("from metasrv import model\n")
    edges = metasrv_edges(tmp_path)
    assert set(edges) == {("kv", "leader"), ("kv", "kafka"), ("kv", "errors"), ("keys", "model")}
    assert set(layering_violations(edges)) == {"kv -> leader", "kv -> kafka"}


# -- public surfaces -------------------------------------------------------------------------------

SCANNED = ["metasrv", "procedures", "api", "cli", "toolbox", "tests", "benchmarks"]

PRIVATE_IMPORT_EXCEPTIONS: dict[tuple[str, str], str] = {}
"""(module, imported target) -> why it cannot go through the package's public names. The list
only shrinks: an entry no longer needed fails the test."""


def _private_owner(target: str) -> str | None:
    """The package a private module or name belongs to (`metasrv.kv._sql.x` -> `metasrv.kv`,
    `procedures.wal_purge._batcher._Coalescer` -> `procedures.wal_purge`), or None."""
    parts = target.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not (part.startswith("__") and part.endswith("__")):
            return ".".join(parts[:i])
    return None


def private_imports(root: Path = ROOT, dirs: list[str] = SCANNED) -> set[tuple[str, str]]:
    """(module, target) for every import of a private module or name from outside its package."""
    found: set[tuple[str, str]] = set()
    for directory in dirs:
        for path in sorted((root / directory).rglob("*.py")):
            package = _package_of(path, root)
            for _, target in _imports(path, root):
                owner = _private_owner(target)
                if target.split(".")[0] in LAYERS and owner is not None and owner != package:
                    found.add((str(path.relative_to(root)), target))
    return found


def test_no_import_of_another_package_private_parts() -> None:
    found = private_imports()
    unexplained = sorted(found - set(PRIVATE_IMPORT_EXCEPTIONS))
    assert unexplained == [], "import the package's public names (add to its __init__ if needed)"
    stale = sorted(set(PRIVATE_IMPORT_EXCEPTIONS) - found)
    assert stale == [], "these exceptions are no longer needed: remove them"


def test_the_private_import_scan_catches_every_form(tmp_path: Path) -> None:
    for package in ("metasrv/kv", "procedures/wal_purge", "cli", "tests"):
        (tmp_path / package).mkdir(parents=True)
    (tmp_path / "metasrv" / "kv" / "_a.py").write_text(
        "from metasrv.kv._sql import normalize_url\nfrom ._common import prefix_range_end\n"
    )
    (tmp_path / "procedures" / "wal_purge" / "_b.py").write_text(
        "from procedures._procedure import Procedure\nfrom procedures import Procedure as P\n"
        "from . import _plan\n"
    )
    (tmp_path / "cli" / "_c.py").write_text(
        "import metasrv.kv._sql\nfrom metasrv.kafka import _helper, KafkaAdmin\n"
        "def f():\n    from api._private import x\n"
    )
    (tmp_path / "tests" / "test_d.py").write_text(
        "def test(monkeypatch):\n"
        '    monkeypatch.setattr("metasrv.leader._checkpoints.FLUSH_SLICE", 3)\n'
        '    monkeypatch.setattr("metasrv.leader.Checkpointer.flush", None)\n'
    )
    assert private_imports(tmp_path, ["metasrv", "procedures", "cli", "tests"]) == {
        ("procedures/wal_purge/_b.py", "procedures._procedure.Procedure"),
        ("cli/_c.py", "metasrv.kv._sql"),
        ("cli/_c.py", "metasrv.kafka._helper"),
        ("cli/_c.py", "api._private.x"),
        ("tests/test_d.py", "metasrv.leader._checkpoints.FLUSH_SLICE"),
    }


# -- import circles --------------------------------------------------------------------------------

CIRCLE_EXCEPTIONS: dict[frozenset[str], str] = {}
"""Circles (their modules) -> why they stay for now. The list only shrinks: an entry no
longer needed fails the test."""


def module_name(path: Path, root: Path = ROOT) -> str:
    """`metasrv/kv/_sql.py` -> `metasrv.kv._sql`; `metasrv/kv/__init__.py` -> `metasrv.kv`."""
    rel = path.relative_to(root).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def module_graph(root: Path = ROOT, dirs: tuple[str, ...] = tuple(LAYERS)) -> dict[str, set[str]]:
    """Project module -> the project modules it imports (`from a.b import C` is `a.b`, or
    `a.b.C` when that is a module)."""
    paths = {module_name(p, root): p for d in dirs for p in sorted((root / d).rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        imported = graph.setdefault(name, set())
        for _, target in _imports(path, root):
            parts = target.split(".")
            for end in range(len(parts), 0, -1):
                candidate = ".".join(parts[:end])
                if candidate in paths:
                    if candidate != name:
                        imported.add(candidate)
                    break
    return graph


def import_circles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The modules of each import circle: the strongly connected components of more than one
    module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: set[frozenset[str]] = set()
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        circles.add(frozenset(component))
    return circles


def test_no_import_circles() -> None:
    graph = module_graph()
    circles = import_circles(graph)
    unexplained = sorted(sorted(c) for c in circles - set(CIRCLE_EXCEPTIONS))
    assert unexplained == [], "modules that import each other (TYPE_CHECKING included)"
    stale = sorted(sorted(c) for c in set(CIRCLE_EXCEPTIONS) - circles)
    assert stale == [], "these circles are gone: remove their exceptions"
    # The scan sees real edges (a graph without them would have no circle to find).
    assert "metasrv.kv._protocol" in graph["metasrv.kv._sql"]
    assert "metasrv.kv" in graph["metasrv.leader._region_map"]


def test_the_circle_scan_catches_a_type_only_circle(tmp_path: Path) -> None:
    (tmp_path / "metasrv" / "kv").mkdir(parents=True)
    (tmp_path / "metasrv" / "kv" / "__init__.py").write_text("from metasrv.kv._a import A\n")
    (tmp_path / "metasrv" / "kv" / "_a.py").write_text("from metasrv.kv._b import B\nA = B\n")
    (tmp_path / "metasrv" / "kv" / "_b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from metasrv.kv._a import A\n"
    )
    (tmp_path / "metasrv" / "kv" / "_c.py").write_text("def f():\n    from metasrv.kv import A\n")
    graph = module_graph(tmp_path, ("metasrv",))
    assert graph["metasrv.kv._c"] == {"metasrv.kv"}
    assert import_circles(graph) == {frozenset({"metasrv.kv._a", "metasrv.kv._b"})}


# -- file names in comments and docstrings -------------------------------------------------------

_FILE_MENTION = re.compile(r"(?<![\w./-])(\w[\w/.-]*\.py)\b")
PRODUCT = ["metasrv", "procedures", "api", "cli", "toolbox", "migrations"]


def missing_file_mentions(root: Path = ROOT, dirs: list[str] = PRODUCT) -> list[str]:
    """`path:line: name` for every `something.py` a product module's text names that does
    not exist: a path from the repository root or the module's folder, or a bare file name
    of the module's own package or a parent of it."""
    found: list[str] = []
    for directory in dirs:
        for path in sorted((root / directory).rglob("*.py")):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                for match in _FILE_MENTION.finditer(line):
                    name = match.group(1)
                    if (root / name).exists() or (path.parent / name).exists():
                        continue
                    if "/" not in name and any(
                        (folder / name).exists()
                        for folder in path.parents
                        if root in folder.parents
                    ):
                        continue
                    found.append(f"{path.relative_to(root)}:{number}: {name}")
    return found


def test_comments_name_files_that_exist() -> None:
    assert missing_file_mentions() == [], "a comment or docstring names a file that is gone"


def test_the_file_mention_scan_catches_a_moved_file(tmp_path: Path) -> None:
    (tmp_path / "metasrv" / "kv").mkdir(parents=True)
    (tmp_path / "metasrv" / "kv" / "_sql.py").write_text(
        '"""See _sql.py, metasrv/kv/_sql.py and ../keys.py; not metasrv/kv/_watch.py."""\n'
    )
    (tmp_path / "metasrv" / "keys.py").write_text("# the watch: _watch.py\n")
    assert missing_file_mentions(tmp_path, ["metasrv"]) == [
        "metasrv/keys.py:1: _watch.py",
        "metasrv/kv/_sql.py:1: metasrv/kv/_watch.py",
    ]


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
