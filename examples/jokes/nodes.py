"""Offline stand-ins for the map-reduce example's model calls (deterministic rules)."""

from __future__ import annotations

import asyncio
from typing import Any

SUBJECTS = {
    "animals": ["hedgehogs", "cats", "owls", "pelicans", "yaks"],
    "space": ["comets", "black holes", "Mars"],
}


def subjects(state: dict[str, Any]) -> dict[str, Any]:
    topic = state["topic"]
    if topic not in SUBJECTS:
        raise ValueError(f"unknown topic {topic!r}; known: {', '.join(sorted(SUBJECTS))}")
    return {"subjects": SUBJECTS[topic]}


async def joke(state: dict[str, Any]) -> dict[str, Any]:
    subject = state["subject"]
    await asyncio.sleep(0.01 * len(subject))  # a model call's latency: items finish out of order
    return {"joke": f"Why do {subject} never get lost? They follow the {subject[::-1]}."}


def best(state: dict[str, Any]) -> dict[str, Any]:
    jokes = [j["joke"] for j in state["jokes"]]
    return {"best": min(jokes, key=len), "count": len(jokes)}
