"""The code a definition's nodes run, as digests: what ``run.started`` records,
so that a run continued by code deployed after it started can say which node changed.

A node's code is the source of the modules it names: a call node's callable's module,
an agent's tools' modules, the module of a router on an edge that leaves it. A
sub-workflow's nodes are its child's (recorded when the child starts); an approval
names no code. A module is found the way the engine would import it (the working
directory first, as `_callables.import_callable` does) and hashed from its file, so a
file edited on disk differs even while a long-lived process still runs the old one --
what a deploy changes is what is detected. Finding a module imports nothing (reading a
stored run's status must not run a package's ``__init__``). A module with no source file
(a builtin, ``__main__``, a function made at run time), or one only a custom import hook
finds, has no digest and is never said to change.
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys
import weakref
from collections.abc import Iterable
from importlib.machinery import PathFinder

from ._model import WorkflowSpec

#: the digests of the modules a definition's nodes run (``{"pkg.mod": "sha256:..."}``): one
#: entry per module, not per node (a 1000-node chain of one module's functions records one);
#: which node runs which module is the definition's (`node_modules`)
CodeDigests = dict[str, str]

_SOURCE = (".py", ".pyw")  # a module's source (not a compiled extension's, nor "built-in")
# a file's digest by (path, size, mtime_ns): a run start hashes only what changed
_CACHE: dict[tuple[str, int, int], str] = {}
_CACHE_LIMIT = 4096


# per (frozen) definition, its nodes' modules: a definition run many times walks its nodes
# once, so a run's start costs O(modules), not O(nodes). The spec is not held: each resume
# reads its definition from the log into a new spec, and holding them kept the last 256
# definitions alive (a 1000-node one is megabytes); its entry goes when it does (the
# weakref's callback runs before its id can be reused)
_Modules = tuple[dict[str, list[str]], list[str]]
_MODULES: dict[int, tuple[weakref.ref[WorkflowSpec], _Modules]] = {}
_MODULES_LIMIT = 256


def node_modules(spec: WorkflowSpec) -> dict[str, list[str]]:
    """Per node, the modules its code lives in (sorted, none repeated); nodes that name no
    code are left out. The answer is shared: read it, do not change it."""
    return _modules(spec)[0]


def _modules(spec: WorkflowSpec) -> _Modules:
    """``spec``'s `node_modules` and all their modules (sorted), from the cache."""
    key = id(spec)
    hit = _MODULES.get(key)
    if hit is not None and hit[0]() is spec:
        return hit[1]
    per_node = _node_modules(spec)
    found = (per_node, sorted({m for mods in per_node.values() for m in mods}))
    if len(_MODULES) >= _MODULES_LIMIT:
        _MODULES.clear()

    def gone(ref: weakref.ref[WorkflowSpec]) -> None:
        entry = _MODULES.get(key)
        if entry is not None and entry[0] is ref:
            del _MODULES[key]

    _MODULES[key] = (weakref.ref(spec, gone), found)
    return found


def _node_modules(spec: WorkflowSpec) -> dict[str, list[str]]:
    out: dict[str, set[str]] = {}
    for name, ns in spec.nodes.items():
        paths: list[str] = []
        if ns.call is not None:
            paths.append(ns.call)
        if ns.agent is not None:
            for tool in ns.agent.get("tools") or ():
                call = tool.get("call") if isinstance(tool, dict) else tool
                if isinstance(call, str):
                    paths.append(call)
        if paths:
            out.setdefault(name, set()).update(_module(p) for p in paths)
    for edge in spec.edges:
        if edge.router is not None:
            for source in edge.source:
                if source in spec.nodes:
                    out.setdefault(source, set()).add(_module(edge.router))
    return {name: sorted(mods) for name, mods in out.items() if mods}


def _module(path: str) -> str:
    return path.partition(":")[0]


def module_file(name: str) -> str | None:
    """The source file a module would be imported from now, or None (no such module, or
    one without a source file). Nothing is imported to find it: a module already
    imported names its file; another is looked up along ``sys.path`` (the working
    directory first, as the engine resolves call paths), package by package."""
    module = sys.modules.get(name)
    if module is not None:
        found = getattr(module, "__spec__", None)
        origin = getattr(found, "origin", None) or getattr(module, "__file__", None)
    else:
        origin = _find_on_path(name)
    return origin if isinstance(origin, str) and origin.endswith(_SOURCE) else None


def _find_on_path(name: str) -> str | None:
    search: list[str] | None = [""] + [p for p in sys.path if p not in ("", ".")]
    found = None
    parts = name.split(".")
    for i in range(len(parts)):
        if search is None:
            return None
        try:
            found = PathFinder.find_spec(".".join(parts[:i + 1]), search)
        except (ImportError, ValueError):
            return None
        if found is None:
            return None
        locations = found.submodule_search_locations
        search = list(locations) if locations is not None else None
    return found.origin if found is not None else None


def module_digest(name: str) -> str | None:
    """``sha256:<hex>`` of the module's source file as it is on disk now (None: none)."""
    path = module_file(name)
    if path is None:
        return None
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            return None
        key = (path, st.st_size, st.st_mtime_ns)
        cached = _CACHE.get(key)
        if cached is not None:
            return cached
        with open(path, "rb") as f:
            digest = "sha256:" + hashlib.sha256(f.read()).hexdigest()
    except OSError:  # gone since it was found, or unreadable: no digest
        return None
    if len(_CACHE) >= _CACHE_LIMIT:
        _CACHE.clear()
    _CACHE[key] = digest
    return digest


def code_digests(spec: WorkflowSpec, nodes: Iterable[str] | None = None) -> CodeDigests:
    """The digests of the modules ``spec``'s nodes (or only ``nodes``) run, as they are now.
    A module with no source file is left out."""
    per_node, modules = _modules(spec)
    if nodes is not None:
        modules = sorted({m for node in set(nodes) for m in per_node.get(node, ())})
    out: CodeDigests = {}
    for mod in modules:
        d = module_digest(mod)
        if d is not None:
            out[mod] = d
    return out


def changed_code(spec: WorkflowSpec, recorded: CodeDigests, now: CodeDigests,
                 nodes: Iterable[str] | None = None) -> dict[str, list[str]]:
    """Per node of ``spec`` (or of ``nodes``) that runs a module whose digest ``recorded``
    is not the same ``now``, the modules that differ. A module not found now is not said
    to differ: this process may not see it (one only a custom import hook finds, before
    anything imported it) -- and one really gone fails the run's plan before any node
    runs."""
    differ = {m for m, d in recorded.items() if m in now and now[m] != d}
    if not differ:
        return {}
    wanted = None if nodes is None else set(nodes)
    out: dict[str, list[str]] = {}
    for node, mods in node_modules(spec).items():
        if wanted is not None and node not in wanted:
            continue
        mine = [m for m in mods if m in differ]  # node_modules' lists are sorted
        if mine:
            out[node] = mine
    return out


__all__ = ["CodeDigests", "changed_code", "code_digests", "module_digest", "node_modules"]
