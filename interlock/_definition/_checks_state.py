"""The checks of the state's fields: the reserved ``error`` field, a condition reading a
gate's data, fields a condition reads that nothing feeds, ``config.`` keys."""

from __future__ import annotations

from .._errors import Severity
from ._checking import CheckContext, _did_you_mean
from ._edge import EdgeSpec
from ._model import ERROR_FIELD


def check_gate_data(checker: CheckContext) -> None:
    """A condition reading ``<gate>.data`` needs the gate to declare ``input:`` (else
    its record has no data: an evaluation error at run time); a field the schema's
    ``properties`` do not name is a warning (a typo, or a schema to extend)."""
    nodes = checker.spec.nodes
    for i, e in enumerate(checker.spec.edges):
        for key in ("when", "switch"):
            src = getattr(e, key)
            expr = checker.result.expressions.get(src) if src is not None else None
            for path in expr.paths if expr is not None else ():
                gate, _, rest = path.partition(".data")
                ns = nodes.get(gate)
                if ns is None or ns.approval is None or rest[:1] not in ("", "."):
                    continue
                schema = ns.approval.input
                if schema is None:
                    checker.add("error", f"edge {e.describe()}: {key} reads {path}, but gate "
                                f"{gate!r} declares no approval.input, so its record has no "
                                "data; declare approval.input (the JSON Schema of what a "
                                "decider sends with --data)", ("edges", i, key), "gate-data")
                    continue
                props = schema.get("properties")
                field = rest[1:].partition(".")[0]
                if field and isinstance(props, dict) and field not in props:
                    checker.add("warning", f"edge {e.describe()}: {key} reads {path}, but the "
                                f"input schema of gate {gate!r} has no property {field!r} "
                                f"(its properties: {', '.join(props) or 'none'})",
                                ("edges", i, key), "gate-data")


def check_reserved(checker: CheckContext) -> None:
    """The ``error`` field is the engine's (an error edge's target reads the caught
    error there): a workflow may read it, not declare or write it."""
    f = ERROR_FIELD
    why = (f"{f!r} is reserved: the engine writes the error an on_error edge caught "
           f"there ({{node, type, message, attempt}}); name the field otherwise")
    if f in checker.spec.input:
        checker.add("error", f"input: {why}", ("input",), "reserved")
    if f in checker.spec.state:
        checker.add("error", f"state: {why}", ("state", f), "reserved")
    for name, ns in checker.spec.nodes.items():
        if ns.writes is not None and f in ns.writes:
            checker.add("error", f"node {name!r}: writes: {why}", ("nodes", name, "writes"),
                        "reserved")
        # an approval writes its decision under its name, an agent its reply and a
        # sub-workflow its result under its output_key (default: its name)
        if ns.output_field(name) == f:
            what = {"approval": "decision", "agent": "reply"}.get(ns.kind, "result")
            checker.add("error", f"node {name!r} would write its {what} to {f!r}: {why}",
                        ("nodes", name), "reserved")


def check_fed(checker: CheckContext) -> None:
    """a condition reading a field that no node writes and neither ``input:``
    nor ``state:`` declares is an error; one declared but never fed, a warning."""
    written, all_known = _written(checker)
    for i, e in enumerate(checker.spec.edges):
        for key in ("when", "switch", "map"):
            src = getattr(e, key)
            expr = checker.result.expressions.get(src) if src else None
            if expr is None:
                continue
            for field_name in expr.names:
                problem = _unfed(checker, field_name, written, all_known)
                if problem is not None:
                    level, why = problem
                    known = written | set(checker.spec.input) | set(checker.spec.state)
                    checker.add(level, f"edge {e.describe()}: {key} reads {field_name!r}"
                                + _did_you_mean(field_name, known) + f", {why}",
                                ("edges", i, key), "never-fed")
        _check_config_reads(checker, i, e)
    _check_shown(checker, written, all_known)


def _check_shown(checker: CheckContext, written: set[str], all_known: bool) -> None:
    """An approval's ``show:`` names fields as a condition does: a misspelt one would
    show the approver ``null``. A mapped approval's item is the map edge's ``as:``."""
    known = written | set(checker.spec.input) | set(checker.spec.state)
    for name, ns in checker.spec.nodes.items():
        if ns.approval is None:
            continue
        items = {e.item_name for e in checker.spec.edges if e.map and name in (e.to or ())}
        for k, field_name in enumerate(ns.approval.show):
            if field_name in items:
                continue
            problem = _unfed(checker, field_name, written, all_known)
            if problem is not None:
                level, why = problem
                checker.add(level, f"node {name!r}: approval shows {field_name!r}"
                            + _did_you_mean(field_name, known) + f", {why}",
                            ("nodes", name, "approval", "show", k), "never-fed")


def _check_config_reads(checker: CheckContext, i: int, e: EdgeSpec) -> None:
    """An edge's ``config.KEY`` that ``config:`` does not declare: a run must --set it."""
    cfg = checker.spec.config
    for src in (e.when, e.switch, e.map):
        if src and "config." in src:
            for key_name in _config_keys(src):
                if key_name not in cfg:
                    checker.add("warning", f"edge {e.describe()}: reads config.{key_name}"
                                + _did_you_mean(key_name, cfg) + ", which 'config:' does "
                                "not declare (a run must --set it)", ("edges", i),
                                "config")


def _written(checker: CheckContext) -> tuple[set[str], bool]:
    """The fields nodes are known to write, and whether that is all of them: a node's
    are known when it declares ``writes`` (an approval writes its own name, an agent
    its output key); one that does not may write anything."""
    written: set[str] = set()
    all_known = True
    for name, ns in checker.spec.nodes.items():
        writes = ns.written(name)
        if writes is None:
            all_known = False
        else:
            written |= writes
    # a map's collect field: the list of its items' updates
    written |= {e.collect for e in checker.spec.edges if e.collect is not None}
    return written, all_known


def _unfed(checker: CheckContext, name: str, written: set[str], all_known: bool
           ) -> tuple[Severity, str] | None:
    if name in ("config", "run") or name in written or name in checker.spec.input:
        return None
    if name == ERROR_FIELD:
        if any(e.catches is not None for e in checker.spec.edges):
            return None  # written by the engine when an error edge catches
        return ("warning", "which only an on_error edge's catch writes, and this "
                "workflow has none")
    if name in checker.spec.state:
        return None if not all_known else (
            "warning", "which 'state' declares but no node writes (declared but never "
            "fed): it stays empty unless a patch sets it")
    if all_known:
        return ("error", "which no node writes (every node declares 'writes') and "
                "neither 'input' nor 'state' declares; fix the name, or declare where "
                "it comes from")
    if not any(ns.writes is not None for ns in checker.spec.nodes.values()):
        # no call node says what it writes: any of them may write any field, so a read
        # cannot be checked -- warning about each would be noise, not a finding
        return None
    return ("warning", "which no node declares in 'writes' and neither 'input' nor "
            "'state' declares: a misspelt name, or a field that a node without 'writes' "
            "returns -- list it in that node's 'writes'")


def _config_keys(src: str) -> list[str]:
    import re

    return re.findall(r"(?<![\w.])config\.([A-Za-z_]\w*)", src)
