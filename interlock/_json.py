"""JSON as it travels through a run: inputs, state, node updates, record payloads.

A recursive alias, so that mypy checks what a value may hold where ``Any`` would let
anything through. Read-only parameters take ``Mapping[str, object]`` or ``JSON`` (``dict``
is invariant: a ``dict[str, int]`` is not a ``dict[str, JSON]``); what the engine builds and
returns is ``JSONObject``.
"""

from __future__ import annotations

from typing import TypeAlias

JSON: TypeAlias = "dict[str, JSON] | list[JSON] | str | int | float | bool | None"
JSONObject: TypeAlias = "dict[str, JSON]"
