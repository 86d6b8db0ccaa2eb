"""State: reducers, scoped reads, and the checks on what a node returns."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .._errors import NodeError, UsageError
from .._log import plain_scalar

# A reducer's ``old`` is the field's value so far: what that reducer accumulates into (or
# None), which `check_whole_values` and `check_update` guarantee; hence Any.


def _replace(_old: object, new: object) -> object:
    return new


def _append(old: Any, new: Any) -> Any:
    return [*(old or ()), new]


def _extend(old: Any, new: Any) -> Any:
    if not isinstance(new, list | tuple):
        raise TypeError(f"the 'extend' reducer takes a list, got {type(new).__name__}")
    return [*(old or ()), *new]


def _merge(old: Any, new: Any) -> Any:
    if not isinstance(new, Mapping):
        raise TypeError(f"the 'merge' reducer takes a mapping, got {type(new).__name__}")
    return {**(old or {}), **new}


def _add(old: Any, new: Any) -> Any:
    if isinstance(new, bool) or not isinstance(new, int | float):
        raise TypeError(f"the 'add' reducer takes a number, got {type(new).__name__}")
    return (old or 0) + new


REDUCERS = {
    "replace": _replace,
    "append": _append,
    "extend": _extend,
    "merge": _merge,
    "add": _add,
}


def merge_update(state: dict[str, Any], update: Mapping[str, object],
                 reducers: Mapping[str, str]) -> None:
    """Merge ``update`` into ``state`` in place, field by field, with each field's reducer."""
    for key, value in update.items():
        reducer = reducers.get(key)
        if reducer is None or reducer == "replace":
            state[key] = value
        else:
            state[key] = REDUCERS[reducer](state.get(key), value)


# reducer -> (what a field's whole value must be, its name for people, an example)
_SEEDS: dict[str, tuple[Callable[[object], bool], str, str]] = {
    "append": (lambda v: isinstance(v, list), "a list", "[]"),
    "extend": (lambda v: isinstance(v, list), "a list", "[]"),
    "merge": (lambda v: isinstance(v, Mapping), "an object", "{}"),
    "add": (lambda v: isinstance(v, int | float) and not isinstance(v, bool), "a number", "0"),
}


def check_whole_values(fields: Mapping[str, object], reducers: Mapping[str, str],
                       what: str) -> None:
    """Values that set a field's whole value -- a run's input, a modify or fork patch --
    must be what its reducer accumulates into: a list for append and extend, an object
    for merge, a number for add (or null: the field starts empty). Else UsageError,
    before anything is recorded: the next merge into it would fail, or (a string for
    append) silently make a list of its characters."""
    for key, value in fields.items():
        check = _SEEDS.get(reducers.get(key, "replace"))
        if check is None or value is None or check[0](value):
            continue
        _, kind, example = check
        raise UsageError(f"{what}: field {key!r} has reducer {reducers[key]!r}, so its value "
                         f"is {kind} (e.g. {example}), not {type(value).__name__} "
                         f"{_short(value)}")


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_update(node: str, update: object, writes: frozenset[str] | None,
                 reducers: Mapping[str, str]) -> tuple[dict[str, Any], bool]:
    """What a node returned, checked: a mapping of declared fields whose reducers accept it.

    Returns a copy of it, and whether it holds only values JSON keeps as they are
    (str, bool, None, finite floats, 64-bit ints) -- the common update, which needs no
    conversion before it is logged. One pass over the fields.
    """
    if update is None:
        return {}, True
    if type(update) is not dict and not isinstance(update, Mapping):
        raise NodeError(
            f"node {node!r} returned {type(update).__name__}; a node returns a mapping of "
            "state updates (or None, or interlock.goto(...) when its edge is 'choose')",
            node=node,
        )
    fields: dict[str, Any] = dict(update)  # a node's values: JSON once converted
    plain = True
    for key, value in fields.items():
        if type(key) is not str:
            if not isinstance(key, str):
                raise NodeError(f"node {node!r} returned a non-string key {key!r}", node=node)
            plain = False  # a str subclass (an enum): logged as its plain string
        if writes is not None and key not in writes:
            extra = sorted(k for k in fields if k not in writes)
            raise NodeError(
                f"node {node!r} returned undeclared field(s) {', '.join(map(repr, extra))}; "
                f"it declares writes: [{', '.join(sorted(writes))}] -- add them there or "
                "stop returning them",
                node=node,
            )
        reducer = reducers.get(key)
        if reducer is not None and reducer != "replace":
            _check_reducer_value(node, key, reducer, value)
        if plain and not plain_scalar(value):
            plain = False  # converted before it is merged and logged
    return fields, plain


def _check_reducer_value(node: str, key: str, reducer: str, value: object) -> None:
    if reducer == "extend" and not isinstance(value, list | tuple):
        raise NodeError(f"node {node!r}: field {key!r} has reducer 'extend' and takes a "
                        f"list, got {type(value).__name__}", node=node)
    if reducer == "merge" and not isinstance(value, Mapping):
        raise NodeError(f"node {node!r}: field {key!r} has reducer 'merge' and takes a "
                        f"mapping, got {type(value).__name__}", node=node)
    if reducer == "add" and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise NodeError(f"node {node!r}: field {key!r} has reducer 'add' and takes a "
                        f"number, got {type(value).__name__}", node=node)


def scoped(state: dict[str, Any], reads: tuple[str, ...] | None) -> dict[str, Any]:
    """The copy of the state a node receives: all of it, or only its ``reads``."""
    if reads is None:
        return dict(state)
    return {k: state[k] for k in reads if k in state}


def check_outcome(node: str, update: dict[str, Any], writes: frozenset[str] | None,
                  reducers: Mapping[str, str]) -> None:
    """The outcome of ``node``'s action a person checked by hand (an unknown outcome's
    ``--data '{"result": ...}'``): recorded as the node's update, so checked as the update
    its body would have returned (`check_update`). Raises UsageError -- nothing recorded."""
    try:
        check_update(node, update, writes, reducers)
    except NodeError as exc:
        extra = sorted(k for k in update if writes is not None and k not in writes)
        why = str(exc)
        if extra and writes is not None:
            import difflib

            close = difflib.get_close_matches(extra[0], sorted(writes), n=1)
            guess = f" (did you mean {close[0]!r}?)" if close else ""
            why = (f"it sets {', '.join(map(repr, extra))}{guess}, which {node!r} does not "
                   f"declare: its writes: are [{', '.join(sorted(writes))}]")
        raise UsageError(f"the decision is refused: the outcome of {node!r} checked by hand "
                         f"is recorded as its update, and checked as one: {why}; send "
                         "--data '{\"result\": {...}}' with the fields the node writes "
                         "(nothing was recorded)") from None
