"""The message format shared by the engine (`_pool`) and the worker (`_worker`): one
JSON object per line (orjson), and the texts both sides build into messages.

Only the standard library and orjson: the worker imports this on every cold start.
"""

from __future__ import annotations

from collections.abc import Mapping

import orjson

_TB_LIMIT = 4000


def _json_default(obj: object) -> object:
    # the conversions of _log (pydantic models, sets, tuples), imported only when needed
    from ..._log import json_default as _default

    return _default(obj)


def _encode(msg: Mapping[str, object]) -> bytes:
    return orjson.dumps(msg, default=_json_default, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"


def _clean(text: str) -> str:
    """``text`` without lone surrogates (orjson rejects them)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _text(exc: BaseException) -> str:
    try:
        return _clean(str(exc))
    except Exception:
        return f"<{type(exc).__name__} with an unprintable message>"


def _size(n: int) -> str:
    for unit, scale in (("GB", 1000**3), ("MB", 1000**2), ("kB", 1000)):
        if n >= scale:
            return f"{n / scale:.4g}{unit}"
    return f"{n}B"
