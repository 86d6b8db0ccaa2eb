"""The file front end: YAML 1.2 / JSON text -> `WorkflowSpec`, with positions.

YAML is read with ruamel.yaml in YAML 1.2 mode (``yes``/``no``/``on``/``off``
stay strings). JSON is a subset of YAML 1.2, so the same reader gives JSON
files line numbers too. Every position is kept in a `SourceMap` so that later
phases (validation, run errors) can name ``file:line:col``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from .._errors import Diagnostic, Location, WorkflowError
from . import _limits, _yaml_fast
from ._bounds import read_at_most, too_big
from ._model import SourceMap, WorkflowSpec
from ._values import Extensible


def read_file(path: str | os.PathLike[str]) -> tuple[dict[str, object], SourceMap]:
    """Parse a workflow file into plain data and a map of positions.

    At most `_limits.WORKFLOW_FILE_BYTES` are read (a device such as /dev/zero, a pipe
    or a huge file is refused after that many), and the document with its aliases
    expanded may have at most `_limits.YAML_NODES` nodes, nested at most
    `_limits.YAML_DEPTH` deep.
    """
    name = str(path)
    text = _read_text(path, name)
    fast = _yaml_fast.read(text, name)  # libyaml, when it reads the file as ruamel would
    if fast is not None:
        data, located = fast
        if not isinstance(data, dict):
            raise _not_a_mapping(name)
        return data, SourceMap(name, located)
    doc = _load_yaml(text, name)
    if not isinstance(doc, dict):
        raise _not_a_mapping(name)
    positions: Positions = {}
    data = _Plain(name, positions).convert(doc)
    return data, SourceMap(name, positions)


def _read_text(path: str | os.PathLike[str], name: str) -> str:
    """The file's text: at most its limit of bytes read, UTF-8."""
    limit = _limits.WORKFLOW_FILE_BYTES
    try:
        with open(path, "rb") as f:
            raw = read_at_most(f, limit.get())
    except OSError as exc:
        raise WorkflowError(
            [Diagnostic("error", f"cannot read workflow file: {exc.strerror or exc}",
                        Location(name))]
        ) from None
    if raw is None:
        raise WorkflowError([Diagnostic("error", too_big("the workflow file", limit),
                                        Location(name))])
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WorkflowError(
            [Diagnostic("error", f"the file is not UTF-8 text (byte {exc.start}: {exc.reason}); "
                        "save it as UTF-8", Location(name))]
        ) from None


def _load_yaml(text: str, name: str) -> Any:
    """ruamel.yaml's round-trip document (YAML 1.2, no duplicate keys), its errors as
    diagnostics at their position."""
    from ruamel.yaml import YAML
    from ruamel.yaml.error import MarkedYAMLError

    yaml = YAML(typ="rt", pure=True)
    yaml.version = (1, 2)
    yaml.allow_duplicate_keys = False
    try:
        return yaml.load(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        col = mark.column + 1 if mark else None
        problem = exc.problem or exc.context or "invalid YAML"
        raise WorkflowError(
            [Diagnostic("error", f"cannot parse the file: {problem}", Location(name, line, col))]
        ) from None
    except RecursionError:  # the YAML reader is recursive: it gives up near 200 levels
        depth = _limits.YAML_DEPTH
        raise WorkflowError(
            [Diagnostic("error", "cannot parse the file: it is nested too deeply for the "
                        f"YAML reader (a workflow may nest {depth.get():_} levels, set by "
                        f"{depth.env}); flatten it", Location(name, 1, 1))]
        ) from None
    except Exception as exc:  # ruamel raises a few unmarked errors (duplicate keys, ...)
        raise WorkflowError(
            [Diagnostic("error", f"cannot parse the file: {exc}", Location(name, 1, 1))]
        ) from None


def _not_a_mapping(name: str) -> WorkflowError:
    return WorkflowError([Diagnostic(
        "error", "a workflow file must be a mapping with 'workflow', 'nodes' and 'edges'",
        Location(name, 1, 1))])


Positions = dict[tuple[object, ...], tuple[int, int]]


class _Plain:
    """ruamel's round-trip objects -> plain dict/list/scalars, recording positions.

    An alias is the same object as its anchor, so each use is expanded again: the
    nodes produced are counted (a few hundred bytes of nested aliases -- "billion
    laughs" -- would otherwise expand to billions) and so is the depth. What an alias
    expands to is located at the alias (its parts at the anchor are located already).
    Iterative: no recursion limit to hit.
    """

    def __init__(self, file: str, positions: Positions) -> None:
        self.file = file
        self.positions = positions

    def convert(self, doc: Any) -> Any:  # Any: ruamel's objects are untyped
        from ruamel.yaml.comments import CommentedMap, CommentedSeq

        nodes_left = _limits.YAML_NODES.get()
        self.check_size(doc, nodes_left)
        max_depth = _limits.YAML_DEPTH.get()
        root: list[Any] = [None]
        seen: set[int] = set()  # containers expanded once (a second time is an alias)
        # (ruamel object, the container its result goes in, the key there, its path,
        #  its depth, whether it is part of an alias's expansion); the path of an
        #  alias's expansion stays the alias's own
        todo: list[tuple[Any, Any, Any, tuple[object, ...], int, bool]] = [
            (doc, root, 0, (), 0, False)]
        pop = todo.pop
        positions = self.positions
        while todo:
            node, parent, slot, path, depth, alias = pop()
            nodes_left -= 1
            if nodes_left < 0:
                self.refuse_size(path, alias)
            if not isinstance(node, CommentedMap | CommentedSeq):
                parent[slot] = _scalar(node)
                continue
            if depth >= max_depth:
                self.refuse_depth(path, depth)
            if not alias:
                alias = id(node) in seen
                seen.add(id(node))
            depth += 1
            parts: list[tuple[Any, Any, Any, tuple[object, ...], int, bool]] = []
            if isinstance(node, CommentedMap):
                out: Any = {}
                lc_key = node.lc.key
                for key, value in node.items():
                    plain_key = _scalar(key)
                    out[plain_key] = None  # keeps the file's order of keys
                    if alias:
                        parts.append((value, out, plain_key, path, depth, True))
                        continue
                    try:
                        line, col = lc_key(key)
                    except KeyError:  # a key merged in (<<: *anchor): where the map is
                        line, col = node.lc.line, node.lc.col
                    kpath = (*path, key)
                    positions[kpath] = (line + 1, col + 1)
                    parts.append((value, out, plain_key, kpath, depth, False))
            else:
                out = [None] * len(node)
                lc_item = node.lc.item
                for i, value in enumerate(node):
                    if alias:
                        parts.append((value, out, i, path, depth, True))
                        continue
                    line, col = lc_item(i)
                    ipath = (*path, i)
                    positions[ipath] = (line + 1, col + 1)
                    parts.append((value, out, i, ipath, depth, False))
            todo.extend(reversed(parts))  # taken in the file's order: an anchor before its aliases
            parent[slot] = out
        return root[0]

    def check_size(self, doc: Any, limit: int) -> None:
        """Refuse a document whose expansion exceeds ``limit`` nodes before expanding it:
        the size of each distinct container is computed once (an alias's is its
        anchor's), so a billion laughs costs what its few hundred bytes hold."""
        from ruamel.yaml.comments import CommentedMap, CommentedSeq

        containers = CommentedMap | CommentedSeq
        sizes: dict[int, int] = {}
        pending: set[int] = set()  # containers whose parts are being sized
        todo: list[tuple[Any, bool]] = [(doc, False)]
        while todo:
            node, parts_done = todo.pop()
            key = id(node)
            values = node.values() if isinstance(node, CommentedMap) else node
            if parts_done:
                pending.discard(key)
                size = sizes[key] = 1 + sum(sizes.get(id(v), 1) for v in values)
                if size > limit:
                    self.refuse_size_at(node)
                continue
            if key in sizes:
                continue
            if key in pending:  # a value that contains itself expands for ever
                self.refuse_size_at(node)
            pending.add(key)
            todo.append((node, True))
            todo.extend((v, False) for v in values
                        if isinstance(v, containers) and id(v) not in sizes)

    def refuse_size_at(self, node: Any) -> None:
        _yaml_fast.refuse_size(self.file, (node.lc.line + 1, node.lc.col + 1), aliased=True)

    def refuse_size(self, path: tuple[object, ...], alias: bool) -> None:
        loc = self.location(path)
        _yaml_fast.refuse_size(self.file, (loc.line, loc.col), aliased=alias)

    def refuse_depth(self, path: tuple[object, ...], depth: int) -> None:
        loc = self.location(path)
        _yaml_fast.refuse_depth(self.file, path, (loc.line, loc.col))

    def location(self, path: tuple[object, ...]) -> Location:
        return Location(self.file, *(SourceMap(self.file, self.positions).locate(path)
                                     or (None, None)))


def _scalar(value: object) -> object:
    # ruamel wraps scalars in str/float/int subclasses that carry formatting; unwrap them
    # so the definition is plain JSON data.
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    return value


def parse(data: Mapping[str, object], source: SourceMap | None = None) -> WorkflowSpec:
    """Validate plain data in the file's shape into a `WorkflowSpec`."""
    if not isinstance(data, dict):
        raise WorkflowError([Diagnostic("error", "a workflow must be a mapping")])
    try:
        spec = WorkflowSpec.model_validate(data)
    except ValidationError as exc:
        raise WorkflowError(_diagnostics(exc, data, source)) from None
    spec._source = source
    return spec


def load_spec(source: str | os.PathLike[str] | dict[str, object], *,
              within: tuple[str, ...] = ()) -> WorkflowSpec:
    """A workflow from a file (or a dict in the file's shape), its sub-workflows read and
    pinned (`resolve_children`); ``within``: the files of the workflows that include this
    one (a workflow that includes itself is refused)."""
    if isinstance(source, dict):
        data, smap, here = source, None, None
    else:
        data, smap = read_file(source)
        here = os.path.realpath(source)
    children: dict[str, WorkflowSpec] = {}
    base = os.path.dirname(here) if here is not None else os.getcwd()
    data = resolve_children(data, smap, base, (*within, here) if here else within, children)
    spec = parse(data, smap)
    spec._children = children
    return spec


def resolve_children(data: dict[str, object], smap: SourceMap | None, base: str,
                     within: tuple[str, ...], children: dict[str, WorkflowSpec]
                     ) -> dict[str, object]:
    """``data`` with each ``workflow: PATH`` node's child read (relative to ``base``, the
    including file's directory) and pinned as ``{file, definition}``; the
    children, with their own source maps, go in ``children`` by node. A child that is
    one of ``within`` (itself, or a workflow including it) is an error at its node."""
    nodes = data.get("nodes") if isinstance(data, dict) else None
    if not isinstance(nodes, dict):
        return data
    out_nodes = dict(nodes)
    for name, node in nodes.items():
        if isinstance(node, dict) and isinstance(node.get("agent"), dict):
            out_nodes[name] = _pin_tools(name, node, smap, base, within)
        if not isinstance(node, dict) or not isinstance(node.get("workflow"), str):
            continue
        rel = node["workflow"]
        where = ("nodes", name, "workflow")
        pos = smap.locate(where) if smap is not None else None
        loc = Location(smap.file if smap else None, *(pos or (None, None)))
        path = os.path.realpath(os.path.join(base, rel))
        if path in within:
            chain = " -> ".join(os.path.basename(p)
                                for p in (*within[within.index(path):], path))
            raise WorkflowError([Diagnostic(
                "error", f"node {name!r}: workflow {rel!r} includes itself ({chain}); a "
                "workflow cannot run itself as a sub-workflow, directly or not -- make the "
                "repeated part a loop (an edge back with a 'when') instead", loc,
                code="recursion")])
        try:
            child = load_spec(path, within=within)
        except WorkflowError as exc:
            if any(d.code == "recursion" for d in exc.diagnostics):
                raise
            raise WorkflowError([Diagnostic(
                "error", f"node {name!r}: its sub-workflow {rel!r} is invalid (below)", loc,
                code="subflow"), *exc.diagnostics]) from None
        children[name] = child
        out_nodes[name] = {**node, "workflow": {"file": rel, "definition": child.definition()}}
    return {**data, "nodes": out_nodes}


def _pin_tools(name: str, node: dict[str, Any], smap: SourceMap | None, base: str,
               within: tuple[str, ...]) -> dict[str, Any]:
    """An agent node with each ``{workflow: FILE}`` tool's child read and pinned as
    ``{file, definition}`` (a workflow as a tool), as a sub-workflow node's."""
    agent = node["agent"]
    tools = agent.get("tools")
    if not isinstance(tools, list) or not any(
            isinstance(t, dict) and isinstance(t.get("workflow"), str) for t in tools):
        return node
    pinned: list[Any] = []
    for i, tool in enumerate(tools):
        if not (isinstance(tool, dict) and isinstance(tool.get("workflow"), str)):
            pinned.append(tool)
            continue
        rel = tool["workflow"]
        where = ("nodes", name, "agent", "tools", i, "workflow")
        pos = smap.locate(where) if smap is not None else None
        loc = Location(smap.file if smap else None, *(pos or (None, None)))
        path = os.path.realpath(os.path.join(base, rel))
        if path in within:
            raise WorkflowError([Diagnostic(
                "error", f"node {name!r}: tool {tool.get('name')!r}: workflow {rel!r} is "
                "this workflow (or one including it); a workflow cannot be its own tool",
                loc, code="recursion")])
        try:
            child = load_spec(path, within=within)
        except WorkflowError as exc:
            if any(d.code == "recursion" for d in exc.diagnostics):
                raise
            raise WorkflowError([Diagnostic(
                "error", f"node {name!r}: tool {tool.get('name')!r}: its workflow {rel!r} "
                "is invalid (below)", loc, code="subflow"), *exc.diagnostics]) from None
        pinned.append({**tool, "workflow": {"file": rel, "definition": child.definition()}})
    return {**node, "agent": {**agent, "tools": pinned}}


def locate(spec: WorkflowSpec, path: tuple[object, ...]) -> Location:
    """The file position of a part of ``spec`` (or just the file when unknown)."""
    smap = spec._source
    if smap is None:  # built in Python: named by its name
        return Location(None, workflow=spec.workflow)
    pos = smap.locate(path)
    return Location(smap.file, *(pos or (None, None)))


def _name(data: object) -> str | None:
    """The name of a workflow given as data (one built in Python), if it has one."""
    name = data.get("workflow") if isinstance(data, dict) else None
    return name if isinstance(name, str) and name else None


def _diagnostics(exc: ValidationError, data: object,
                 source: SourceMap | None) -> list[Diagnostic]:
    out = []
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        path = _data_path(loc, data)
        where = ".".join(str(p) for p in path) or "the workflow"
        msg = err["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        if err["type"] == "extra_forbidden":
            msg = _unknown_key(path)
        elif err["type"] == "missing":
            msg = f"missing required key {path[-1]!r}"
        pos = source.locate(path) if source else None
        line, col = pos or (None, None)
        location = Location(source.file if source else None, line, col,
                            workflow=None if source else _name(data))
        out.append(Diagnostic("error", f"{where}: {msg}", location, code="schema"))
    return out


def _unknown_key(path: tuple[object, ...]) -> str:
    return unknown_key(str(path[-1]), valid_keys(path[:-1]))


def unknown_key(key: str, keys: list[str]) -> str:
    """'unknown key 'retires' (did you mean 'retry'?); the keys here are: ...'."""
    import difflib

    if not keys:
        return f"unknown key {key!r} (check its spelling)"
    close = difflib.get_close_matches(key, keys, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown key {key!r}{hint}; the keys here are: {', '.join(keys)}"


def valid_keys(path: tuple[object, ...], root: object = WorkflowSpec) -> list[str]:
    """The keys a mapping at ``path`` of a workflow file (or of a block validated by
    ``root``, a model) may have -- the model's fields as a file spells them -- or [] when
    that is not a model's mapping."""
    import types
    import typing

    from pydantic import BaseModel

    def models(tp: object) -> list[object]:
        """The types a field's annotation may hold, unwrapped (Optional, Annotated)."""
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            return models(typing.get_args(tp)[0])
        if origin in (typing.Union, types.UnionType):
            return [m for a in typing.get_args(tp) for m in models(a)]
        return [tp]

    current: list[object] = [root]
    for part in path:
        step: list[object] = []
        for tp in current:
            origin = typing.get_origin(tp)
            if isinstance(tp, type) and issubclass(tp, BaseModel) and isinstance(part, str):
                for name, info in tp.model_fields.items():
                    if part in (name, info.alias):
                        step.extend(models(info.annotation))
            elif origin is dict and isinstance(part, str):
                step.extend(models(typing.get_args(tp)[1]))
            elif origin is list and isinstance(part, int):
                step.extend(models(typing.get_args(tp)[0]))
        current = step
    for tp in current:
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            keys = [info.alias or name for name, info in tp.model_fields.items()]
            if issubclass(tp, Extensible):
                keys.append("x-... (any key starting with x-: ignored, e.g. for YAML anchors)")
            return keys
    return []


def _data_path(loc: tuple[object, ...], data: object) -> tuple[object, ...]:
    """Drop pydantic's internal steps (union tags, function names) from an error path."""
    path: list[object] = []
    cur: Any = data  # a dict, a list or a scalar: narrowed as it is walked
    for part in loc:
        in_list = isinstance(cur, list) and isinstance(part, int) and 0 <= part < len(cur)
        if (isinstance(cur, dict) and part in cur) or in_list:
            path.append(part)
            cur = cur[part]
        elif part == "from" or (isinstance(cur, dict) and part == "source" and "from" in cur):
            path.append("from")
            cur = cur.get("from") if isinstance(cur, dict) else None
        elif isinstance(part, str) and (part.startswith(("function-", "union", "list[")) or
                                        part in ("str", "int", "dict", "list")):
            continue
        else:
            path.append(part)
            cur = None
    return tuple(path)
