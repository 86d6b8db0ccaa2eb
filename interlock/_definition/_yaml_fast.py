"""A fast path for reading workflow files: libyaml's parser (through PyYAML's C
binding) instead of ruamel.yaml's pure-Python one, which takes about 1 ms per line
(a 10 000-node chain: 13 s to parse, against 0.3 s here).

It gives what `_spec.read_file`'s ruamel path gives -- plain data, positions of keys
and items, YAML 1.2 scalars as ruamel resolves them, aliases expanded within
`_limits.YAML_NODES`, nesting within `_limits.YAML_DEPTH` -- for the files it knows
how to read, and declines (None) everything else: a parse error, an explicit tag, a
merge key, a duplicate key, a non-scalar key, a ``%YAML`` directive, several
documents, or a scalar it does not convert exactly as ruamel would (an octal, a
timestamp, ...). The ruamel path then reads the file, so its answer (and its error
messages) stay authoritative.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .._errors import Diagnostic, Location, WorkflowError
from . import _limits

Positions = dict[tuple[object, ...], tuple[int, int]]

_INT = re.compile(r"[-+]?(?:0|[1-9][0-9]*)\Z")
_FLOAT = re.compile(r"[-+]?(?:[0-9]+\.[0-9]*(?:[eE][-+]?[0-9]+)?|[0-9]+[eE][-+]?[0-9]+)\Z")
_STR = "tag:yaml.org,2002:str"
_NULL = "tag:yaml.org,2002:null"
_BOOL = "tag:yaml.org,2002:bool"
_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"


class _Decline(Exception):
    """Not a file this path reads exactly as ruamel does: use the ruamel path."""


def _parser() -> tuple[Callable[..., object], Any] | None:
    try:
        import yaml
        return yaml.parse, yaml.CSafeLoader
    except (ImportError, AttributeError):  # no PyYAML, or built without libyaml
        return None


def _resolver() -> Callable[[str], str]:
    from ruamel.yaml.nodes import ScalarNode
    from ruamel.yaml.resolver import VersionedResolver

    resolve = VersionedResolver(version=(1, 2)).resolve
    return lambda value: str(resolve(ScalarNode, value, (True, False)))


def _plain_scalar(value: str, resolve: Callable[[str], str]) -> object:
    if not value:
        return None
    first = value[0]
    if first.isalpha() and first not in "tTfFnN":  # the common case: a name, a call
        return value
    tag = resolve(value)
    if tag == _STR:
        return value
    if tag == _NULL:
        return None
    if tag == _BOOL:
        return value in ("true", "True", "TRUE")
    if tag == _INT_TAG and _INT.match(value):
        return int(value)
    if tag == _FLOAT_TAG and _FLOAT.match(value):
        return float(value)
    raise _Decline  # octal, hex, underscores, .inf, timestamps, merge keys, ...


def read(text: str, file: str) -> tuple[object, Positions] | None:
    """``text`` as plain data and positions, or None to leave it to the ruamel path.
    Raises `WorkflowError` for a document over the node or depth limit."""
    parser = _parser()
    if parser is None:
        return None
    parse, loader = parser
    import yaml

    try:
        return _build(parse(text, Loader=loader), file, _resolver())
    except (_Decline, yaml.YAMLError, RecursionError):
        return None


def _build(events: Any, file: str, resolve: Callable[[str], str]
           ) -> tuple[object, Positions]:
    builder = _Builder(file, resolve)
    for ev in events:
        builder.event(ev)
    return builder.result()


_NO_KEY = object()


class _Builder:
    """Plain data from a stream of parser events: a stack of open containers."""

    def __init__(self, file: str, resolve: Callable[[str], str]) -> None:
        import yaml

        self.file = file
        self.resolve = resolve
        self.nodes_left = _limits.YAML_NODES.get()
        self.max_depth = _limits.YAML_DEPTH.get()
        self.positions: Positions = {}
        self.starts: dict[int, tuple[int, int]] = {}  # container id -> its (line, col)
        self.anchors: dict[str, object] = {}
        self.anchored_at: dict[str, tuple[int, int]] = {}  # where each anchor's value starts
        self.aliased = False
        # a frame: [container, its path, the pending key (_NO_KEY: none yet)]
        self.stack: list[list[Any]] = []
        self.root: list[object] = []
        self.documents = 0
        self.scalar_t, self.alias_t = yaml.ScalarEvent, yaml.AliasEvent
        self.map_t, self.seq_t = yaml.MappingStartEvent, yaml.SequenceStartEvent
        self.ends = (yaml.MappingEndEvent, yaml.SequenceEndEvent)
        self.doc_t = yaml.DocumentStartEvent

    def event(self, ev: Any) -> None:
        t = type(ev)
        if t is self.scalar_t:
            if ev.tag is not None and ev.tag != "!":
                raise _Decline  # an explicit tag
            value: object = (ev.value if ev.style else  # quoted or a block scalar: text
                          _plain_scalar(ev.value, self.resolve))
            self.place(ev, value, container=False, alias=False)
        elif t is self.map_t or t is self.seq_t:
            if ev.tag is not None and ev.tag != "!":
                raise _Decline
            self.place(ev, {} if t is self.map_t else [], container=True, alias=False)
        elif t is self.alias_t:
            try:
                value = self.anchors[ev.anchor]
            except KeyError:
                raise _Decline from None
            self.aliased = True  # placed whole: its parts were placed at the anchor
            self.place(ev, value, container=False, alias=True)
        elif t in self.ends:
            if self.stack.pop()[2] is not _NO_KEY:
                raise _Decline
        elif t is self.doc_t:
            self.documents += 1
            if self.documents > 1 or getattr(ev, "version", None) or \
                    getattr(ev, "tags", None):
                raise _Decline

    def place(self, ev: Any, value: object, *, container: bool, alias: bool) -> None:
        self.nodes_left -= 1
        if alias:  # located where its anchor's value is (as ruamel locates it)
            pos = self.anchored_at[ev.anchor]
        else:
            mark = ev.start_mark
            pos = (mark.line + 1, mark.column + 1)
            if ev.anchor is not None:
                self.anchors[ev.anchor] = value
                self.anchored_at[ev.anchor] = pos
        path: tuple[object, ...] = ()
        if not self.stack:
            if self.root:
                raise _Decline
            self.root.append(value)
        else:
            top = self.stack[-1]
            parent, ppath, key = top
            if type(parent) is dict:
                if key is _NO_KEY:  # this is a key
                    if container or alias or value in parent or value == "<<" \
                            or not isinstance(value, str | int | float | bool | None):
                        raise _Decline  # a duplicate, merge or non-scalar key
                    top[2] = value
                    self.positions[(*ppath, value)] = pos
                    return
                parent[key] = value
                top[2] = _NO_KEY
                path = (*ppath, key)
            else:
                path = (*ppath, len(parent))
                self.positions[path] = pos
                parent.append(value)
        if self.nodes_left < 0 and not self.aliased:
            refuse_size(self.file, self.positions.get(path) or pos, aliased=False)
        if container:
            if len(self.stack) >= self.max_depth:
                refuse_depth(self.file, path, self.positions.get(path) or pos)
            self.starts[id(value)] = pos
            self.stack.append([value, path, _NO_KEY])

    def result(self) -> tuple[object, Positions]:
        if not self.root:
            raise _Decline
        data = self.root[0]
        if self.aliased:
            _check_expanded(data, self.starts, self.file, _limits.YAML_NODES.get())
            data = _fresh(data)  # each alias use its own copy, as the ruamel path gives
        return data, self.positions


def _check_expanded(data: object, starts: dict[int, tuple[int, int]], file: str,
                    limit: int) -> None:
    """The expanded size of ``data`` (whose containers an alias may share), computed once
    per distinct container; refused at the first one over ``limit``."""
    sizes: dict[int, int] = {}
    todo: list[tuple[Any, bool]] = [(data, False)]
    while todo:
        node, parts_done = todo.pop()
        key = id(node)
        values = node.values() if type(node) is dict else node
        if parts_done:
            size = sizes[key] = 1 + sum(sizes.get(id(v), 1) for v in values)
            if size > limit:
                refuse_size(file, starts.get(key, (None, None)), aliased=True)
            continue
        if key in sizes:
            continue
        todo.append((node, True))
        todo.extend((v, False) for v in values
                    if type(v) in (dict, list) and id(v) not in sizes)


def _fresh(value: object) -> object:
    """A copy sharing no container (nesting is within YAML_DEPTH: recursion is safe)."""
    if type(value) is dict:
        return {k: _fresh(v) for k, v in value.items()}
    if type(value) is list:
        return [_fresh(v) for v in value]
    return value


def refuse_size(file: str, pos: tuple[int | None, int | None], *, aliased: bool) -> None:
    """Refuse a document over `_limits.YAML_NODES` (``aliased``: because of its aliases)."""
    limit = _limits.YAML_NODES
    why = (": the value here is that large once the aliases in it are expanded (each use "
           "of an alias repeats its anchor's value in full)" if aliased else "")
    raise WorkflowError([Diagnostic(
        "error", f"the document has more than {limit.get():_} nodes with its aliases "
        f"expanded{why}; use fewer or smaller aliases, or raise the limit with "
        f"{limit.env}=NODES", Location(file, *pos))])


def refuse_depth(file: str, path: tuple[object, ...], pos: tuple[int | None, int | None]
                 ) -> None:
    """Refuse a document nested deeper than `_limits.YAML_DEPTH`, at ``path``."""
    limit = _limits.YAML_DEPTH
    shown = ".".join(map(str, path[:6])) + ("..." if len(path) > 6 else "")
    raise WorkflowError([Diagnostic(
        "error", f"the document is nested more than {limit.get():_} levels deep (at "
        f"{shown or 'the top'}); flatten it, or raise the limit with {limit.env}=LEVELS",
        Location(file, *pos))])
