"""frlab's packages form layers: no import cycle between them, lazy imports included.

Each subpackage of frlab (frlab.config, frlab.rollout, ...), each top-level module
(frlab.train, frlab.build, ...) and each environment package (envs.math, envs.base, ...)
is one node; `A -> B` when a module of A imports one of B anywhere (function-level imports
count: they are dependencies all the same). The graph must have no cycle, so that every
package can be read, tested and replaced on top of the ones below it. The same holds module by
module (`module_graph`), and frlab.config keeps its size.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("frlab", "envs")


def node_of(module: str) -> str | None:
    """The graph node holding `module`: `frlab.X` for a subpackage or top-level module."""
    parts = module.split(".")
    if parts[0] not in PACKAGES:
        return None
    return ".".join(parts[:2])


def imported(path: Path, module: str) -> Iterator[str]:
    """Every module `path` imports (absolute; `from P import m` yields `P.m` when m is one)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                package = module.split(".")[: -node.level]
                base = ".".join([*package, *([base] if base else [])])
            for alias in node.names:
                full = f"{base}.{alias.name}"
                is_module = (ROOT / full.replace(".", "/")).is_dir() or (
                    ROOT / (full.replace(".", "/") + ".py")
                ).is_file()
                yield full if is_module else base


def package_graph(root: Path = ROOT) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for top in PACKAGES:
        for path in sorted((root / top).rglob("*.py")):
            module = ".".join(path.relative_to(root).with_suffix("").parts)
            module = module.removesuffix(".__init__")
            source = node_of(module)
            if source is None or source in PACKAGES:  # the package roots re-export only
                continue
            for name in imported(path, module):
                target = node_of(name)
                if target and target != source and target not in PACKAGES:
                    graph.setdefault(source, set()).add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_between_packages() -> None:
    graph = package_graph()
    assert "frlab.config" in graph and "frlab.evaluation" in graph  # the walk found the tree
    assert cycles(graph) == [], {v: sorted(graph[v]) for c in cycles(graph) for v in c}


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def module_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Each module of frlab and envs -> the modules of theirs it imports, lazy imports included
    (`from P import name` counts as P when `name` is not a module)."""
    paths = {
        ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): path
        for top in PACKAGES
        for path in sorted((root / top).rglob("*.py"))
    }
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        for name in imported(path, module):
            while name and name not in paths:  # `frlab.x.y.CONST` -> frlab.x.y
                name = name.rpartition(".")[0]
            if name and name != module:
                graph.setdefault(module, set()).add(name)
    return graph


def test_no_import_cycle_between_modules() -> None:
    """No module imports, through any chain, a module that imports it (the finer graph)."""
    graph = module_graph()
    assert "frlab.config.preflight" in graph and "frlab.rollout.engine" in graph
    assert cycles(graph) == [], {v: sorted(graph[v]) for c in cycles(graph) for v in c}


def test_the_module_graph_sees_a_lazy_import_cycle(tmp_path: Path) -> None:
    (tmp_path / "frlab" / "config").mkdir(parents=True)
    (tmp_path / "frlab" / "config" / "a.py").write_text("from frlab.config.b import X\n")
    (tmp_path / "frlab" / "config" / "b.py").write_text("def f():\n    import frlab.config.a\n")
    assert cycles(module_graph(tmp_path)) == [["frlab.config.a", "frlab.config.b"]]


CONFIG = ROOT / "frlab" / "config"


def test_config_errors_are_a_leaf_every_owner_may_import() -> None:
    """`frlab.errors` (ConfigError) imports nothing of frlab but the name registry's matcher, so
    every owner of a setting raises it; frlab.config's own error translation stands on it."""
    graph = module_graph()
    assert graph.get("frlab.errors", set()) <= {"frlab.registry"}, graph.get("frlab.errors")
    assert graph.get("frlab.registry", set()) == set()
    below = graph.get("frlab.config.errors", set())
    assert not [m for m in below if m.startswith("frlab.config")], below


def test_evaluation_and_tracking_sit_below_config() -> None:
    """The configuration layer composes the run; the evaluation and run-file packages it wires
    never import it back (evaluation gets the run's env factory passed in)."""
    graph = package_graph()
    assert "frlab.config" not in graph.get("frlab.evaluation", set())
    assert "frlab.tracking" not in graph.get("frlab.config", set())


def test_tracking_knows_neither_evaluation_nor_environments() -> None:
    """Run files and metrics (frlab.tracking) are written the same whatever is evaluated or
    played: tracking imports no evaluation and no environment package."""
    graph = package_graph()
    below = graph.get("frlab.tracking", set())
    assert "frlab.evaluation" not in below and not any(n.startswith("envs.") for n in below), below


# --- frlab.rollout: the shared core, the pool, one folder per backend ------------------------

ROLLOUT = ROOT / "frlab" / "rollout"
# every folder of frlab.rollout but the pool is an engine backend (a new engine is one folder)
BACKENDS = tuple(
    sorted(p.name for p in ROLLOUT.iterdir() if (p / "__init__.py").is_file() and p.name != "pool")
)
MAY_IMPORT = {"remote": {"vllm"}}  # the backends a backend may import besides the core and itself


def rollout_part(module: str) -> str:
    """The part of frlab.rollout that holds `module`: a backend, `pool`, or `core` (the modules
    at the top of frlab.rollout); empty outside frlab.rollout."""
    parts = module.split(".")
    if parts[:2] != ["frlab", "rollout"]:
        return ""
    if len(parts) > 3 or (ROLLOUT / parts[-1]).is_dir():
        return parts[2]
    return "core"


def rollout_imports() -> dict[str, set[str]]:
    """Each module of frlab.rollout -> the parts of frlab.rollout it imports (other than its
    own), lazy imports included."""
    out: dict[str, set[str]] = {}
    for path in sorted(ROLLOUT.rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        own = rollout_part(module)
        out[module] = {p for name in imported(path, module) if (p := rollout_part(name))} - {own}
    return out


def test_rollout_backends_import_the_core_and_only_the_backends_they_may() -> None:
    """torch/ and vllm/ import no other backend; remote/ may import vllm/, never the reverse;
    a new backend folder imports none."""
    found = rollout_imports()
    assert {"torch", "vllm", "remote"} <= set(BACKENDS)
    assert {rollout_part(m) for m in found} == {*BACKENDS, "pool", "core"}  # the walk found them
    wrong = {}
    for module, parts in found.items():
        backend = rollout_part(module)
        others = parts & set(BACKENDS) - MAY_IMPORT.get(backend, set())
        if backend in BACKENDS and others:
            wrong[module] = sorted(others)
    assert not wrong, wrong


def test_the_rollout_core_and_pool_import_no_backend() -> None:
    """The core (engine, weight modes, agent loop, ...) and the pool know engines only through
    the `Engine` interface: a run imports only the backend its `rollout.engine` names."""
    wrong = {
        m: sorted(parts & set(BACKENDS))
        for m, parts in rollout_imports().items()
        if rollout_part(m) in ("core", "pool") and parts & set(BACKENDS)
    }
    assert not wrong, wrong


def test_no_rollout_file_name_carries_a_backend_prefix() -> None:
    """A backend's files are named in its folder (`vllm/args.py`, not `vllm_args.py`)."""
    named = [
        p.relative_to(ROOT)
        for p in ROLLOUT.rglob("*")
        if "__pycache__" not in p.parts and any(p.name.startswith(f"{b}_") for b in BACKENDS)
    ]
    assert not named, named


def test_the_backend_rule_finds_a_wrong_import() -> None:
    assert rollout_part("frlab.rollout.vllm.args") == "vllm"
    assert rollout_part("frlab.rollout.vllm") == "vllm" and rollout_part("frlab.rollout") == "core"
    assert rollout_part("frlab.rollout.weight_modes") == "core" and rollout_part("frlab.x") == ""
