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


def signature_problem(fn: Callable[..., object]) -> str | None:
    """Why ``fn`` cannot be called as a node -- as ``fn(state)`` or ``fn(state, ctx)`` --
    or None (also when its signature cannot be read: the call then tells).

    For validation: a node function with three required parameters, none at all, or a
    required keyword-only one would otherwise fail with a TypeError only when it runs.
    """
    import inspect

    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        positional_ok = True
    else:
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        required = [p.name for p in positional if p.default is p.empty]
        if len(required) > 2:
            return f"takes {len(required)} required parameters ({', '.join(required)})"
        positional_ok = bool(positional)
    if not positional_ok:
        return "takes no parameters"
    keyword = [p.name for p in params if p.kind is p.KEYWORD_ONLY and p.default is p.empty]
    if keyword:
        return (f"has the required keyword-only parameter{'s' if len(keyword) > 1 else ''} "
                f"{', '.join(keyword)}")
    return None


def defined_at(fn: Callable[..., object]) -> str:
    """`` (def NAME at FILE:LINE)`` for a plain function, else ``""``."""
    import os

    target: Any = getattr(fn, "__func__", fn)
    code = getattr(target, "__code__", None)
    if not isinstance(code, types.CodeType):
        return ""
    path = code.co_filename
    try:
        rel = os.path.relpath(path)
        path = rel if not rel.startswith("..") else path
    except ValueError:  # another drive (Windows)
        pass
    return f" (def {target.__name__} at {path}:{_def_line(code)})"


def _def_line(code: types.CodeType) -> int:
    """The line of the ``def`` of ``code``'s function: its first line is its first
    decorator's (``@wf.node(...)``) when it has any; the source tells the ``def`` line
    (a function without source: the first line)."""
    import linecache

    first = code.co_firstlineno
    for n in range(first, first + 200):
        text = linecache.getline(code.co_filename, n)
        if not text:  # (no source, or past its end)
            break
        if text.lstrip().startswith(("def ", "async def ")):
            return n
    return first
