"""The package is layered: each module imports only modules of its own layer or below.

Every import counts -- at module level, inside a function, under TYPE_CHECKING -- since a
deferred import that points up hides a dependency of the design, not removes it. The
layers are docs/design.md's; a new module must be given one here.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

import interlock

ROOT = Path(interlock.__file__).resolve().parent

LAYERS: dict[int, set[str]] = {
    # leaves: errors, records and the chain, limits, small helpers
    0: {"_definition", "_engine", "_observe", "_ops", "_plugins", "_worker", "_errors", "_log",
        "_json", "_hints", "_gate_text", "_extras", "_keys",
        "_engine._records", "_definition._limits", "_definition._bounds", "_definition._callables",
        "_definition._signature", "_engine._steps", "_definition._cost", "_definition._values"},
    # the definition, expressions, the graph, the stores, isolation's wire format, the
    # fast YAML reader
    1: {"_definition._model", "_definition._edge", "_definition._expr", "_definition._graph",
        "_store", "_store._base",
        "_store._memory", "_store._sqlite", "_store._postgres", "_engine._isolation._protocol",
        "_store._rows", "_store._sqlite_sql", "_store._sqlite_upgrade", "_store._sqlite_thread",
        "_store._search", "_store._sqlite_search", "_store._postgres_search",
        "_store._sqlite_ops", "_store._postgres_sql", "_store._postgres_conn",
        "_store._postgres_writes", "_store._postgres_claims", "_store._sqlite_file",
        "_store._sqlite_wal", "_store._sqlite_writes", "_store._sqlite_watch",
        "_store._file_events", "_store._sqlite_inline", "_store._postgres_listen",
        "_definition._yaml_fast", "_observe._otel"},
    # the file front end, state updates, rendering, the node-kind protocol
    2: {"_definition._spec", "_definition._state", "_definition._render", "_definition._kinds",
        "_worker._triggers", "_definition._digest"},
    # static checks (their shared context, one module per family of checks) and the
    # frozen plan (node kinds injected)
    3: {"_definition._validate", "_definition._checking", "_definition._checks_nodes",
        "_definition._checks_triggers", "_definition._checks_edges", "_definition._checks_state",
        "_definition._checks_graph", "_definition._plan"},
    # the flow machine, the fold, its snapshots, approvals, the journal (records sealed,
    # folded, stored), the lease keeper (leases renewed off the event loop)
    4: {"_engine._flow", "_engine._view", "_engine._gates", "_engine._migration", "_engine._fold",
        "_engine._snapshot", "_engine._approvals", "_engine._journal", "_engine._lease",
        "_engine._item_gates", "_engine._staging", "_engine._expand"},
    # the node call: its context, the guards, process isolation
    5: {"_engine._context", "_engine._budget", "_engine._guards", "_engine._call",
        "_engine._mapped", "_engine._ray",
        "_engine._isolation", "_engine._isolation._pool", "_engine._isolation._worker",
        "_engine._isolation.__main__", "_engine._origin"},
    # the agent node kind, a plug-in on the node call
    6: {"_plugins._subflow", "agents", "agents._check", "agents._errors", "agents._node",
        "agents._prompt", "agents._providers", "agents._spec", "agents._tools",
        "agents._chat", "agents._delegates", "agents._recall", "agents._mcp",
        "agents._agent_setup", "agents._tool_exec", "agents._tool_calls"},
    # the scheduler and its edge decisions, and the wiring of the shipped node kinds
    7: {"_engine._runner", "_engine._decide", "_engine._finish", "_plugins._compile"},
    # stored runs: drive, resume, status, trace, verify, fork, cancel; their coverage;
    # executing them in a pool (a server's, a worker's); node visits (the dashboard's)
    8: {"_ops._load", "_ops._claims", "_ops._cancel", "_ops._children", "_ops._execute",
        "_ops._verify", "_ops._runs", "_observe._coverage", "_ops._export", "_ops._prune",
        "_observe._metrics", "_worker._workers", "_ops._visits", "_ops._code",
        "_ops._migrate", "_ops._messages",
        "_ops._outcomes", "_ops._gate_refusals", "_ops._final", "_ops._orphans",
        "_ops._gate_closed", "_ops._watcher", "_ops._resume_keys"},
    # the façade: builder and loaded file
    9: {"_workflow", "_builder"},
    # the public surface and the command line
    10: {"", "__main__", "testing", "support", "cli", "cli._common", "cli._format", "cli._inspect",
        "cli._progress", "cli._run", "cli._trace", "cli._coverage", "cli._prune", "cli._serve",
        "cli._gate_hints", "cli._decided",
        "cli._remote", "cli._triggers", "cli._worker", "cli._migrate", "cli._mcp", "mcp",
        "mcp._tools", "mcp._local", "mcp._conversation", "mcp._runs",
        "mcp._tasks", "server", "server._app",
        "server._auth",
        "server._hub", "server._main", "server._models", "server._notify", "server._pool",
        "server._dashboard", "server._loops", "server._reads", "server._guard",
        "server._service", "server._deps", "server._routes_runs", "server._routes_approvals",
        "server._routes_workflows", "server._routes_meta", "server._layout", "cli._chat",
        "cli._chat_lines", "cli._chat_live", "cli._chat_remote", "cli._verify",
        "server._routes_messages", "server._mcp",
        "server._chat", "server._slack", "server._google_chat", "server._routes_chat",
        "server._deliveries"},
}
LAYER_OF = {m: n for n, mods in LAYERS.items() for m in mods}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in ROOT.rglob("*.py")}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                mod = ".".join([*base, *([node.module] if node.module else [])])
            elif (node.module or "").startswith("interlock"):
                mod = (node.module or "").removeprefix("interlock").removeprefix(".")
            else:
                continue
            targets = [f"{mod}.{a.name}".lstrip(".") if f"{mod}.{a.name}".lstrip(".") in known
                       else mod for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name.removeprefix("interlock").removeprefix(".") for a in node.names
                       if a.name == "interlock" or a.name.startswith("interlock.")]
        out.update(t for t in targets if t in known and t != name)
    return out


def test_no_import_cycles() -> None:
    """Within a layer modules may import each other, but never around a cycle: a cycle is
    one concept in several files (or an import that waits for a module half loaded)."""
    modules = _modules()
    graph = {name: _imports(name, path, set(modules)) for name, path in modules.items()}
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as cycle:
        pytest.fail(f"an import cycle: {' -> '.join(cycle.args[1])}: move what both need "
                    "into a module below them")


def test_every_module_has_a_layer() -> None:
    missing = sorted(set(_modules()) - set(LAYER_OF))
    assert not missing, f"give these modules a layer in tests/test_layers.py: {missing}"


@pytest.mark.parametrize("name", sorted(set(_modules()) & set(LAYER_OF)))
def test_a_module_imports_only_its_own_layer_or_below(name: str) -> None:
    """(A module without a layer fails `test_every_module_has_a_layer`.)"""
    modules = _modules()
    layer = LAYER_OF[name]
    upward = sorted(f"{dep or 'interlock'} (layer {LAYER_OF[dep]})"
                    for dep in _imports(name, modules[name], set(modules))
                    if LAYER_OF.get(dep, -1) > layer)
    assert not upward, f"interlock.{name} (layer {layer}) imports higher layers: {upward}"


@pytest.mark.parametrize("name", ["_engine._runner", "_engine._finish", "_engine._decide",
                                  "_engine._call",
                                  "_engine._mapped", "_engine._guards", "_engine._records"])
def test_only_the_journal_touches_the_store(name: str) -> None:
    """The executor writes records through a `_records.Sink`; `_journal` is the one that
    stores them."""
    modules = _modules()
    deps = _imports(name, modules[name], set(modules))
    assert not {d for d in deps if d == "_store" or d.startswith("_store.")}


@pytest.mark.parametrize("name", sorted(m for m in _modules()
                                        if m.startswith(("cli", "server", "mcp"))))
def test_the_tools_use_only_the_public_api_and_the_support_surface(name: str) -> None:
    """The command line, the server and the MCP tools are tools on top: each imports `interlock`,
    `interlock.support` and its own modules (the CLI also the server's public package,
    for ``interlock serve``, and the MCP tools' package, for ``interlock mcp`` and the
    server's ``/mcp``)."""
    modules = _modules()
    tool = name.split(".")[0]
    allowed = {"", "support"} | {"cli": {"server", "mcp"}, "server": {"mcp"}}.get(tool, set())
    private = sorted(dep for dep in _imports(name, modules[name], set(modules))
                     if dep not in allowed and dep.split(".")[0] != tool)
    assert not private, (f"interlock.{name} imports private modules {private}: use "
                         "interlock or interlock.support (add the name there if it is missing)")
