"""The value types a definition is written in, and the base every definition model shares.

Names (`NAME_RE`), durations (``30s``, ``250ms``), sizes (``512MB``, ``1GiB``), counts
(never a boolean) and name lists (``a`` for ``[a]``) as pydantic annotated types; `Strict`
(no unknown key, frozen) and `Extensible` (which also keeps ``x-*`` keys). The models of
`_model` and `_edge` are built from these; nothing here knows what a node or an edge is.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Self

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

# a node's, a state field's or an error class's name: an identifier, so that a CEL
# condition can read it
NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(value: object) -> float:
    """'30s', '0.5s', '250ms', '5m', '1h', '30d' or a number of seconds -> float seconds."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 30s, 250ms or 5m, got a boolean")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        m = _DURATION_RE.match(value)
        if m:
            return float(m.group(1)) * _UNITS[m.group(2)]
    raise ValueError(f"expected a duration such as 30s, 250ms or 5m, got {value!r}")


Duration = Annotated[float, BeforeValidator(parse_duration), Field(gt=0)]


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.I)
_SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4,
               "ki": 1024, "mi": 1024**2, "gi": 1024**3, "ti": 1024**4}


def parse_size(value: object) -> int:
    """'512MB', '1GiB', '200m' or a number of bytes -> int bytes."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as 256MB or 1GiB, got a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m:
            unit = (m.group(2) or "").lower().rstrip("b")
            return int(float(m.group(1)) * _SIZE_UNITS[unit])
    raise ValueError(f"expected a size such as 256MB or 1GiB, got {value!r}")


Size = Annotated[int, BeforeValidator(parse_size), Field(gt=0)]


def whole_number(value: object) -> object:
    """A count (limits.steps, tokens, attempts, max): an int, never a boolean -- in
    Python ``True`` is the int 1, so ``steps: true`` would be a limit of 1 step."""
    if isinstance(value, bool):
        raise ValueError(f"expected a whole number such as 50, got a boolean "
                         f"({str(value).lower()})")
    return value


Count = Annotated[int, BeforeValidator(whole_number)]


def as_list(value: object) -> object:
    """``a`` as short for ``[a]`` (a name list, an error edge's class names)."""
    return [value] if isinstance(value, str) else value


NameList = Annotated[list[str], BeforeValidator(as_list)]


class Strict(BaseModel):
    """A definition model: an unknown key is an error, a model is frozen once read, and a
    field is given by its name or its alias (``from``, ``as``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


def _extension_key(key: object) -> bool:
    return isinstance(key, str) and key.startswith("x-")


class Extensible(Strict):
    """A mapping that may also carry ``x-*`` keys (the home of YAML anchors, as in
    docker-compose and OpenAPI: ``x-defaults: &defaults {...}``): ignored by the engine,
    kept in the definition (and its hash)."""

    _extensions: dict[str, object] = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _take_extensions(cls, data: object, handler: ModelWrapValidatorHandler[Self]
                         ) -> Self:
        ext: dict[str, object] = {}
        if isinstance(data, dict) and any(_extension_key(k) for k in data):
            ext = {k: v for k, v in data.items() if _extension_key(k)}
            data = {k: v for k, v in data.items() if not _extension_key(k)}
        obj = handler(data)
        if ext:
            obj._extensions = ext
        return obj

    @model_serializer(mode="wrap")
    def _dump_extensions(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if self._extensions and isinstance(data, dict):
            data.update(self._extensions)
        return data

    @property
    def extensions(self) -> dict[str, object]:
        """Its ``x-*`` keys, as declared."""
        return dict(self._extensions)
