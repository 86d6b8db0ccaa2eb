"""The checks of the nodes themselves: call targets that import, the executor's
package, each node kind's own check, approval gates (on_timeout, on_modify, the
JSON Schema of a decision's data)."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping

from .._extras import install_hint
from ._checking import CheckContext, _did_you_mean
from ._signature import defined_at, signature_problem


def check_nodes(checker: CheckContext) -> None:
    for name, ns in checker.spec.nodes.items():
        if ns.call is not None:
            checker.resolve(ns.call, ("nodes", name, "call"), f"node {name!r}")
            check_signature(checker, name, ns.call)
        if ns.executor == "ray" and importlib.util.find_spec("ray") is None:
            checker.add("error", f"node {name!r}: executor: ray runs its body on Ray, which "
                        f"is not installed here: {install_hint('ray')} (or run the "
                        "workflow where Ray is)", ("nodes", name, "executor"), "import")
        for kind in checker.kinds:
            if kind.owns(ns):
                kind.check(checker, name, ns)
        if ns.approval is not None:
            tgt = ns.approval.on_timeout
            if tgt != "reject" and tgt not in checker.spec.nodes:
                checker.add("error", f"node {name!r}: on_timeout must be 'reject' or a node; "
                            f"{tgt!r} is neither", ("nodes", name, "approval", "on_timeout"),
                            "unknown-node")
            if ns.confirm:
                checker.add("error", f"node {name!r}: an approval node is a gate already; "
                            "'confirm' belongs on call nodes", ("nodes", name, "confirm"),
                            "confirm")
            for target in ns.approval.on_modify:
                if target not in checker.spec.nodes:
                    checker.add("error", f"node {name!r}: on_modify names unknown node "
                                f"{target!r}" + _did_you_mean(target, checker.spec.nodes),
                                ("nodes", name, "approval", "on_modify"),
                                "unknown-node")
            if ns.approval.input is not None:
                check_input_schema(checker, name, ns.approval.input)


def check_signature(checker: CheckContext, name: str, call: str) -> None:
    """A node function is called as ``fn(state)`` or ``fn(state, ctx)``: one that cannot
    be is refused here, not with a TypeError when the run reaches it."""
    fn = checker.result.callables.get(call)
    problem = signature_problem(fn) if fn is not None else None
    if problem is not None and fn is not None:
        checker.add("error", f"node {name!r}: {call} {problem}; a node takes (state) or "
                    f"(state, ctx){defined_at(fn)}", ("nodes", name, "call"), "signature")


def check_input_schema(checker: CheckContext, name: str, schema: Mapping[str, object]
                       ) -> None:
    """An approval's ``input:`` must be a JSON Schema (2020-12) a decision can meet."""
    from jsonschema import Draft202012Validator, SchemaError

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        at = "".join(f"[{p!r}]" for p in exc.path)
        checker.add("error", f"node {name!r}: approval.input is not a valid JSON Schema "
                    f"(2020-12): {exc.message}" + (f" at {at}" if at else "") + "; it is "
                    "the schema a decision's --data must satisfy, e.g. {type: object, "
                    "properties: {amount: {type: number}}, required: [amount]}",
                    ("nodes", name, "approval", "input"), "approval-input")
