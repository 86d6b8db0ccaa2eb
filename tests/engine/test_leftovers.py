"""What a run leaves behind in its process: nothing that grows with the number of runs.

Each test runs a batch of runs, takes the process's counts (threads, asyncio tasks, open
file descriptors, live objects of the engine's types), runs a batch several times larger
and checks the counts did not grow with it. Counts, not timings: a leak of one object per
run shows as hundreds here however loaded the machine.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import os
import threading
from pathlib import Path

from interlock import END, START, Workflow, approve

WATCHED = ("WorkflowSpec", "NodeSpec", "Plan", "RunView", "Journal", "Task", "Future")


def leftovers() -> dict[str, int]:
    """What is alive in this process now, by kind."""
    gc.collect()
    kinds = collections.Counter(type(o).__name__ for o in gc.get_objects())
    out = {name: kinds[name] for name in WATCHED}
    out["threads"] = threading.active_count()
    out["fds"] = len(os.listdir("/proc/self/fd"))
    return out


def grown(before: dict[str, int], after: dict[str, int], slack: int = 3) -> dict[str, str]:
    return {k: f"{before[k]} -> {after[k]}" for k in before if after[k] > before[k] + slack}


def gated() -> Workflow:
    wf = Workflow("gated")
    wf.node("a", lambda s: {"x": 1})
    wf.approval("ok")
    wf.node("b", lambda s: {"y": 2})
    wf.edge(START, "a").edge("a", "ok").edge("ok", "b").edge("b", END)
    return wf


def test_resumed_runs_leave_no_definition_behind(tmp_path: Path) -> None:
    # Each resume reads its run's definition from the log into a new spec; the code
    # digests' cache held every one of them (up to 256 definitions: a 1000-node
    # definition is megabytes each). Now a spec goes when its resume does.
    wf = gated()
    url = f"sqlite:///{tmp_path}/runs.db"

    async def runs(n: int) -> None:
        for _ in range(n):
            waiting = await wf.run({}, store=url)
            assert waiting.status == "WAITING_APPROVAL"
            done = await wf.resume(waiting.run_id, approve(by="ann"), store=url)
            assert done.status == "COMPLETED"

    async def main() -> tuple[dict[str, int], dict[str, int]]:
        await runs(10)
        before = leftovers()
        await runs(60)
        return before, leftovers()

    before, after = asyncio.run(main())
    assert not grown(before, after), grown(before, after)
