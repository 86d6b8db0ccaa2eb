"""Applying the bounds of `_limits` to what interlock reads: files read up to their
limit and no further, JSON data measured (nesting depth, encoded size) before it is
kept. Each check says what was found, what the bound is and which environment
variable raises it."""

from __future__ import annotations

from typing import IO, Any

from . import _limits
from ._errors import UsageError

_CONTAINERS = (dict, list, tuple)


def read_at_most(f: IO[bytes], limit: int) -> bytes | None:
    """Up to ``limit`` bytes of ``f``; None when it holds more (after reading ``limit``
    + 1 bytes: an endless device or pipe is not read to its end)."""
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = f.read(limit + 1 - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return None if size > limit else b"".join(chunks)


def too_big(what: str, limit: _limits.Limit, size: int | None = None) -> str:
    """The message for ``what`` being larger than ``limit`` (``size``: its size, if known)."""
    found = f"is {size:_} bytes, more than" if size is not None else "is larger than"
    return (f"{what} {found} the {limit.get():_} bytes interlock accepts ({limit.what}); "
            f"make it smaller, or raise the limit with {limit.env}=BYTES")


def too_deep_at(value: Any, limit: int) -> str | None:
    """Where ``value`` (JSON data) nests deeper than ``limit`` levels (a JSON path such
    as ``$.a[0].b``, shortened), or None when it does not. Iterative: data nested far
    deeper than Python's recursion limit is measured all the same."""
    if not isinstance(value, _CONTAINERS):
        return None
    stack: list[tuple[Any, int, tuple[Any, ...]]] = [(value, 1, ())]
    while stack:
        node, depth, path = stack.pop()
        if depth > limit:
            return _json_path(path)
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, child in items:
            if isinstance(child, _CONTAINERS):
                stack.append((child, depth + 1, (*path, key) if depth < 6 else path))
    return None


def _json_path(path: tuple[Any, ...]) -> str:
    text = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)
    return text + ("..." if len(path) >= 5 else "")


def too_deep(what: str, where: str | None, limit: _limits.Limit = _limits.INPUT_DEPTH) -> str:
    """The message for ``what`` nesting deeper than ``limit`` (at ``where``, if known)."""
    at = f" (at {where})" if where else ""
    return (f"{what} is nested more than {limit.get():_} levels deep{at}; flatten it, or "
            f"raise the limit with {limit.env}=LEVELS")


def check_data(value: Any, what: str, encoded_size: int | None = None) -> None:
    """UsageError when ``value`` (a run input, a patch) nests deeper than INPUT_DEPTH
    or its JSON (``encoded_size`` bytes, when the caller has it) is larger than
    INPUT_BYTES. Nothing about it is stored before this check."""
    where = too_deep_at(value, _limits.INPUT_DEPTH.get())
    if where is not None:
        raise UsageError(too_deep(what, where))
    if encoded_size is not None and encoded_size > _limits.INPUT_BYTES.get():
        raise UsageError(too_big(what, _limits.INPUT_BYTES, encoded_size))
