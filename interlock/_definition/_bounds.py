"""Applying the bounds of `_limits` to what interlock reads: files read up to their
limit and no further, JSON data measured (nesting depth, encoded size) before it is
kept. Each check says what was found, what the bound is and which environment
variable raises it."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import IO, Any

from .. import _log
from .._errors import UsageError
from . import _limits

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


def too_deep_at(value: object, limit: int) -> str | None:
    """Where ``value`` (JSON data) nests deeper than ``limit`` levels (a JSON path such
    as ``$.a[0].b``, shortened), or None when it does not. Iterative: data nested far
    deeper than Python's recursion limit is measured all the same."""
    if not isinstance(value, _CONTAINERS):
        return None
    stack: list[tuple[Any, int, tuple[object, ...]]] = [(value, 1, ())]
    while stack:
        node, depth, path = stack.pop()
        if depth > limit:
            return _json_path(path)
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, child in items:
            if isinstance(child, _CONTAINERS):
                stack.append((child, depth + 1, (*path, key) if depth < 6 else path))
    return None


def _json_path(path: tuple[object, ...]) -> str:
    text = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)
    return text + ("..." if len(path) >= 5 else "")


def too_deep(what: str, where: str | None, limit: _limits.Limit = _limits.INPUT_DEPTH) -> str:
    """The message for ``what`` nesting deeper than ``limit`` (at ``where``, if known)."""
    at = f" (at {where})" if where else ""
    return (f"{what} is nested more than {limit.get():_} levels deep{at}; flatten it, or "
            f"raise the limit with {limit.env}=LEVELS")


def check_config(config: Mapping[str, object] | None) -> None:
    """UsageError when a run's config overrides are not JSON data within the input's
    bounds (depth, size, no NaN or lone surrogate), as a run's input is checked."""
    if not config:
        return
    what = "the run's config"
    check_data(config, what)
    try:
        size = len(_log.dumps(_log.to_json_value(dict(config))))
    except TypeError as exc:
        raise UsageError(f"{what} is not JSON data: {exc}") from None
    check_data(None, what, size)


def not_json_at(value: object) -> tuple[str, str] | None:
    """Where ``value`` holds what JSON cannot carry faithfully, and what: a NaN or an
    infinity (JSON has none; they would be stored as null), or a string with a lone
    surrogate (no UTF-8 encodes it). None when it holds neither."""
    stack: list[tuple[Any, tuple[object, ...]]] = [(value, ())]
    while stack:
        node, path = stack.pop()
        if isinstance(node, float) and not math.isfinite(node):
            return _json_path(path), f"the number {node!r} (JSON has no NaN or infinity)"
        if isinstance(node, str):
            if not _encodes(node):
                return _json_path(path), "a string with a lone surrogate (not Unicode text)"
        elif isinstance(node, dict):
            for key, child in node.items():
                if isinstance(key, str) and not _encodes(key):
                    return _json_path(path), "a key with a lone surrogate (not Unicode text)"
                stack.append((child, (*path, key) if len(path) < 6 else path))
        elif isinstance(node, list | tuple):
            stack.extend((child, (*path, i) if len(path) < 6 else path)
                         for i, child in enumerate(node))
    return None


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_data(value: object, what: str, encoded_size: int | None = None) -> None:
    """UsageError when ``value`` (a run input, a patch, a config) nests deeper than
    INPUT_DEPTH, holds a NaN, an infinity or a lone surrogate, or its JSON
    (``encoded_size`` bytes, when the caller has it) is larger than INPUT_BYTES.
    Nothing about it is stored before this check."""
    where = too_deep_at(value, _limits.INPUT_DEPTH.get())
    if where is not None:
        raise UsageError(too_deep(what, where))
    bad = not_json_at(value) if value is not None else None
    if bad is not None:
        raise UsageError(f"{what} holds {bad[1]} at {bad[0]}; send JSON data")
    if encoded_size is not None and encoded_size > _limits.INPUT_BYTES.get():
        raise UsageError(too_big(what, _limits.INPUT_BYTES, encoded_size))


# A run id a person or a tool chooses (``--run-id``, the API's ``run_id``, a fork's new
# id): what fits in a URL path segment and a file name as it is. Ids interlock makes
# (random hex, a child's ``parent.node.visit``) are made of the same characters.
RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"
_RUN_ID = re.compile(RUN_ID_PATTERN)


def check_run_id(run_id: str) -> None:
    """UsageError unless ``run_id`` fits `RUN_ID_PATTERN`."""
    if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id):
        raise UsageError(f"the run id {run_id!r} is not one interlock accepts: 1 to 128 "
                         "letters, digits, '.', '_', ':' or '-', starting with a letter or "
                         "digit (so that it can be named in a URL, e.g. "
                         "/api/runs/RUN_ID, and on a command line)")
