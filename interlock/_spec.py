"""The file front end: YAML 1.2 / JSON text -> `WorkflowSpec`, with positions.

YAML is read with ruamel.yaml in YAML 1.2 mode (``yes``/``no``/``on``/``off``
stay strings). JSON is a subset of YAML 1.2, so the same reader gives JSON
files line numbers too. Every position is kept in a `SourceMap` so that later
phases (validation, run errors) can name ``file:line:col``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ._errors import Diagnostic, Location, WorkflowError
from ._model import SourceMap, WorkflowSpec


def read_file(path: str | os.PathLike[str]) -> tuple[dict[str, Any], SourceMap]:
    """Parse a workflow file into plain data and a map of positions."""
    from ruamel.yaml import YAML
    from ruamel.yaml.error import MarkedYAMLError

    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise WorkflowError(
            [Diagnostic("error", f"cannot read workflow file: {exc.strerror or exc}",
                        Location(name))]
        ) from None
    except UnicodeDecodeError as exc:
        raise WorkflowError(
            [Diagnostic("error", f"the file is not UTF-8 text (byte {exc.start}: {exc.reason}); "
                        "save it as UTF-8", Location(name))]
        ) from None
    yaml = YAML(typ="rt", pure=True)
    yaml.version = (1, 2)
    yaml.allow_duplicate_keys = False
    try:
        doc = yaml.load(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        col = mark.column + 1 if mark else None
        problem = exc.problem or exc.context or "invalid YAML"
        raise WorkflowError(
            [Diagnostic("error", f"cannot parse the file: {problem}", Location(name, line, col))]
        ) from None
    except Exception as exc:  # ruamel raises a few unmarked errors (duplicate keys, ...)
        raise WorkflowError(
            [Diagnostic("error", f"cannot parse the file: {exc}", Location(name, 1, 1))]
        ) from None
    if not isinstance(doc, dict):
        raise WorkflowError(
            [Diagnostic("error", "a workflow file must be a mapping with 'workflow', 'nodes' "
                        "and 'edges'", Location(name, 1, 1))]
        )
    positions: Positions = {}
    data = _plain(doc, (), positions)
    return data, SourceMap(name, positions)


Positions = dict[tuple[Any, ...], tuple[int, int]]


def _plain(node: Any, path: tuple[Any, ...], positions: Positions) -> Any:
    """ruamel's round-trip objects -> plain dict/list/scalars, recording positions."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    if isinstance(node, CommentedMap):
        out: dict[Any, Any] = {}
        for key, value in node.items():
            line, col = node.lc.key(key)
            positions[(*path, key)] = (line + 1, col + 1)
            out[_scalar(key)] = _plain(value, (*path, key), positions)
        return out
    if isinstance(node, CommentedSeq):
        items = []
        for i, value in enumerate(node):
            line, col = node.lc.item(i)
            positions[(*path, i)] = (line + 1, col + 1)
            items.append(_plain(value, (*path, i), positions))
        return items
    return _scalar(node)


def _scalar(value: Any) -> Any:
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


def parse(data: dict[str, Any], source: SourceMap | None = None) -> WorkflowSpec:
    """Validate plain data in the file's shape into a `WorkflowSpec`."""
    if not isinstance(data, dict):
        raise WorkflowError([Diagnostic("error", "a workflow must be a mapping")])
    try:
        spec = WorkflowSpec.model_validate(data)
    except ValidationError as exc:
        raise WorkflowError(_diagnostics(exc, data, source)) from None
    spec._source = source
    return spec


def load_spec(source: str | os.PathLike[str] | dict[str, Any]) -> WorkflowSpec:
    if isinstance(source, dict):
        return parse(source, None)
    data, smap = read_file(source)
    return parse(data, smap)


def locate(spec: WorkflowSpec, path: tuple[Any, ...]) -> Location:
    """The file position of a part of ``spec`` (or just the file when unknown)."""
    smap = spec._source
    if smap is None:
        return Location(None)
    pos = smap.locate(path)
    return Location(smap.file, *(pos or (None, None)))


def _diagnostics(exc: ValidationError, data: dict[str, Any],
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
            msg = f"unknown key {path[-1]!r} (check its spelling; see SPEC §1 for the keys)"
        elif err["type"] == "missing":
            msg = f"missing required key {path[-1]!r}"
        pos = source.locate(path) if source else None
        location = Location(source.file if source else None, *(pos or (None, None)))
        out.append(Diagnostic("error", f"{where}: {msg}", location, code="schema"))
    return out


def _data_path(loc: tuple[Any, ...], data: Any) -> tuple[Any, ...]:
    """Drop pydantic's internal steps (union tags, function names) from an error path."""
    path: list[Any] = []
    cur = data
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
