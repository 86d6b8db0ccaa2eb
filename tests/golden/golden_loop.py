"""The nodes of the ``loop-format*`` golden logs (a chain, a loop, a fan-out and a join),
and of ``gated-loop-format3`` (a loop, a gate, a loop after it)."""

from typing import Any


async def inc(state: dict[str, Any]) -> dict[str, Any]:
    return {"i": state.get("i", 0) + 1}

async def fan(state: dict[str, Any]) -> dict[str, Any]:
    return {"seen": ["fan"]}

async def left(state: dict[str, Any]) -> dict[str, Any]:
    return {"seen": ["left"]}

async def right(state: dict[str, Any]) -> dict[str, Any]:
    return {"seen": ["right"]}

async def done(state: dict[str, Any]) -> dict[str, Any]:
    return {"done": True}

async def inc_j(state: dict[str, Any]) -> dict[str, Any]:
    return {"j": state.get("j", 0) + 1}
