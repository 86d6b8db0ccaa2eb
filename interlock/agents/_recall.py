"""``recall: true``: a conversation's agent searches the messages of earlier
conversations of its workflow -- the store's full-text search (SQLite FTS5, PostgreSQL's
text search; `Store.search_messages`) -- and gets the best matches with their run id and
seq. A call is a tool step like any other: journaled, so a replay gives the same results.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ._delegates import _data_tool
from ._errors import AgentError
from ._tools import Tool

if TYPE_CHECKING:
    from .._engine._context import Context

RECALL_LIMIT = 5


class RecallTool:
    def __init__(self) -> None:
        self.tool: Tool = _data_tool(
            "recall", "Search the messages of earlier conversations (full text): the best "
            f"matches (at most {RECALL_LIMIT}), each with its run_id, seq, kind (message: "
            "the user's; reply: yours) and text.", {"query": (str, ...)})

    async def run(self, ctx: Context, base: Mapping[str, Any], kwargs: dict[str, Any]) -> Any:
        from .._plugins._subflow import CHILD_RUNS

        host = CHILD_RUNS.get()
        if host is None:
            raise AgentError("recall searches the run's store, which needs the run executing "
                             "the agent")
        found = await host.search_messages(str(kwargs["query"]), RECALL_LIMIT)
        return [f.to_json() for f in found]
