"""Workflows as MCP tools: the MCP server that ``interlock mcp`` serves over
stdio and ``interlock serve`` at ``/mcp``.

`tools_server` builds an MCP SDK low-level ``Server`` over `Runs` -- where the runs it
starts execute: this process (`LocalRuns`, stdio), or a server's pool (the server's own
`ServerRuns`, in ``interlock.server._mcp``). Needs the ``mcp`` extra.
"""

from __future__ import annotations

from ._local import LocalRuns
from ._runs import Caller, Progress, Refused, Runs
from ._tools import STATUS_TOOL, input_schema, tools_server

__all__ = ["STATUS_TOOL", "Caller", "LocalRuns", "Progress", "Refused", "Runs", "input_schema",
           "tools_server"]
