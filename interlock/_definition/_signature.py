"""How many positional arguments a node function takes -- one rule for the engine and for
isolated workers (which import only this, not the engine).

A node gets ``ctx`` when it takes a second positional parameter that is required or
named ``ctx``, or ``*args``. ``def f(state, limit=3)`` is not asking for it.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

_CO_VARARGS = 0x04


def param_count(fn: Callable[..., object]) -> int:
    """The number of positional arguments ``fn`` wants (2 = it wants ``ctx``)."""
    target: Any = fn
    bound = 0
    if isinstance(target, types.MethodType):
        target, bound = target.__func__, 1
    if isinstance(target, types.FunctionType):  # fast: no inspect for plain functions
        code = target.__code__
        if code.co_flags & _CO_VARARGS:
            return 2
        names = code.co_varnames[bound:code.co_argcount]
        required = code.co_argcount - len(target.__defaults__ or ()) - bound
        return max(required, names.index("ctx") + 1 if "ctx" in names else 0)
    import inspect

    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return 1
    count = 0
    for p in sig.parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            return 2
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and (
                p.default is p.empty or p.name == "ctx"):
            count += 1
    return count
