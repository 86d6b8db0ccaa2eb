"""An agent's API key unset where a run would execute: the run refused before anything
is recorded, and the failed run's remedy.

An ``openai`` agent reads its key from a variable of the process that executes the
run (``$OPENAI_API_KEY``, or its ``api_key_env``). Validate warns of one unset in this
process (code ``api-key``; an MCP server header's ``${VAR}`` counts the same:
`agents._check.check_headers`). A process that would execute the run itself -- ``interlock
run`` and ``chat``, a server with its own workers -- refuses to start it: otherwise the
nodes before the agent would run, with their effects, and the run would fail at it. A
process that only records the run for another (``run --detach``, ``serve --workers 0``)
starts it: the executor may have the key.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from ._errors import Diagnostic, UsageError

KEY_CODE = "api-key"  # validate's code of the warning


class NoKey(UsageError):
    """A run (or a conversation's turn) refused before anything is recorded: an agent
    node it may reach has no API key in the environment of the process that would
    execute it. (A server answers it 409.)"""


def unkeyed(warnings: Iterable[Diagnostic]) -> list[Diagnostic]:
    """The agents whose key variable is unset in this process: validate's ``api-key``
    warnings of a workflow."""
    return [w for w in warnings if w.code == KEY_CODE]


def key_refusal(keys: list[Diagnostic], fix: str, *, what: str = "the run was not started",
                here: str = "here") -> str:
    """Why ``what`` was refused: each agent whose key variable is unset (``keys``, with
    their ``file:line:col``), and ``fix``."""
    lines = [str(w).replace(": warning: ", ": ", 1) for w in keys]
    lacks = "no API key" if all("no API key" in w.message for w in keys) else \
        "a variable unset (an API key, an MCP server header's)"
    return (f"{what} (nothing is recorded): an agent node it may reach has {lacks} "
            f"{here}\n  " + "\n  ".join(lines) + f"\n  {fix}")


_NO_KEY = re.compile(r"no API key: set \$([A-Za-z_][A-Za-z0-9_]*)")


def missing_key(error: Mapping[str, Any] | None) -> str | None:
    """The variable a failed run's agent found unset (the run's ``error``), or None
    when it failed otherwise."""
    err = error or {}
    details = err.get("details") or {}
    if details.get("exception") not in ("AgentConfigError", "AgentEnvironmentError"):
        return None
    found = _NO_KEY.search(str(err.get("message") or ""))
    return found.group(1) if found else None
