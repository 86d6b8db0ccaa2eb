"""The code-assistant loop's function nodes (examples/code_assistant/workflow.yaml).

``check_code`` runs what the model wrote -- first its imports, then the imports with the
code -- and lets whatever it raises propagate: the workflow's error edges route on it
(a NameError, an ImportError, ... back to ``generate``, with the error in the state).
It runs model-written code, so the workflow runs it with ``isolation: process`` (its own
OS process, killed on timeout); a real deployment would sandbox it further.
"""

from __future__ import annotations

from typing import Any


def check_code(state: dict[str, Any]) -> dict[str, Any]:
    solution = state["generate"]
    scope: dict[str, Any] = {}
    exec(solution["imports"], scope)  # an ImportError fails the import check
    exec(solution["imports"] + "\n" + solution["code"], scope)  # and anything else, the run
    return {"checked": {"attempts": len(state["attempts"]) + 1,
                        "result": repr(scope.get("result"))}}


def note_attempt(state: dict[str, Any]) -> dict[str, Any]:
    """Keep every failed attempt (the ``error`` field holds only the last)."""
    return {"attempts": {"code": state["generate"]["code"], "error": state["error"]}}


def give_up(state: dict[str, Any]) -> dict[str, Any]:
    error = state["error"]
    tries = len(state["attempts"]) + 1  # the failures noted, and this last one
    return {"answer": f"no working code after {tries} attempts; last "
                      f"error: {error['type']}: {error['message']}"}


def answer(state: dict[str, Any]) -> dict[str, Any]:
    solution = state["generate"]
    return {"answer": f"{solution['prefix']}\n\n{solution['imports']}\n{solution['code']}"}
