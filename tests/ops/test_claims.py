"""A lost claim stops the run at once (issue 26), in one process: another owner claims
the run while a node runs; the lease keeper's renewal (or ``ctx.once``'s check) finds
the claim gone; the node in hand is cancelled, nothing more is appended, the effect
after the takeover never runs, and the executor is told the run moved. ``ctx.claim``
is the claim the run executes under."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import interlock
from interlock._engine import _lease
from interlock._ops._execute import continue_claimed
from interlock._store import Claim, ClaimLost, MemoryStore, Store, open_store
from interlock.support import Worker


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    return MemoryStore() if request.param == "memory" else \
        open_store(f"sqlite:///{tmp_path / 'runs.db'}")


def _workflow(seen: dict[str, Any], waiting: asyncio.Event, go: asyncio.Event
              ) -> interlock.Workflow:
    async def work(state: dict[str, Any], ctx: interlock.Context) -> dict[str, Any]:
        seen["claim"] = ctx.claim
        def before() -> int:
            seen["before"] = seen.get("before", 0) + 1
            return 1

        await ctx.once("before", before)
        waiting.set()
        try:
            await go.wait()
            await ctx.once("after", lambda: seen.__setitem__("after", True))
        except asyncio.CancelledError:
            seen["cancelled"] = True
            raise
        return {"n": 1}

    wf = interlock.Workflow("claimed", input=["n"])
    wf.node("work", work)
    wf.edge("START", "work")
    wf.edge("work", "END")
    return wf


async def _takeover(store: Store, caplog: pytest.LogCaptureFixture, *, go_first: bool
                    ) -> tuple[dict[str, Any], int, int]:
    seen: dict[str, Any] = {}
    waiting, go = asyncio.Event(), asyncio.Event()
    wf = _workflow(seen, waiting, go)
    await wf.submit({"n": 0}, store=store, run_id="r1")
    worker = Worker(store, workflows={"claimed": wf}, poll=0.05, lease=0.9)
    task = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(waiting.wait(), 30)
        row = await store.get_run("r1")
        assert seen["claim"] == Claim(str(row.owner), row.generation)
        taken = await store.claim("r1", "other-host:1:x", 60, force=True)  # another owner
        assert taken is not None
        stored = len(await store.entries("r1"))
        if go_first:
            go.set()  # the node goes on before any renewal: ctx.once checks the claim
        for _ in range(600):
            if "moved to owner other-host:1:x" in caplog.text:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        return seen, stored, taken
    finally:
        worker.stop()
        await task


def test_a_lost_claim_cancels_the_node_and_appends_nothing(
        store: Store, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        try:
            seen, stored, taken = await _takeover(store, caplog, go_first=False)
            assert seen.get("cancelled") and "after" not in seen  # stopped, as a cancel
            assert len(await store.entries("r1")) == stored  # nothing appended after
            row = await store.get_run("r1")
            assert (row.owner, row.generation) == ("other-host:1:x", taken)
            assert f"(claim generation {taken}) while this process held generation " \
                   f"{taken - 1}" in caplog.text
        finally:
            await store.close()

    with caplog.at_level(logging.WARNING, logger="interlock"):
        asyncio.run(main())


def test_ctx_once_checks_a_claim_whose_renewals_stopped(
        store: Store, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the keeper renews nothing (as in a paused process, or before its next renewal):
    # ctx.once asks the store before the effect
    monkeypatch.setattr(_lease.Keeper, "_renew", lambda self, held: setattr(
        held, "due", held.due + 3600))

    async def main() -> None:
        try:
            seen, stored, _ = await _takeover(store, caplog, go_first=True)
            assert "after" not in seen and seen.get("before") == 1
            assert seen.get("cancelled")
            assert len(await store.entries("r1")) == stored
        finally:
            await store.close()

    with caplog.at_level(logging.WARNING, logger="interlock"):
        asyncio.run(main())


def test_a_stale_append_is_told_as_a_moved_run(store: Store) -> None:
    async def main() -> None:
        try:
            async def step(state: dict[str, Any]) -> dict[str, Any]:
                return {"n": state["n"] + 1}

            wf = interlock.Workflow("one", input=["n"])
            wf.node("a", step)
            wf.edge("START", "a")
            wf.edge("a", "END")
            await wf.submit({"n": 0}, store=store, run_id="r2")
            gen = await store.claim("r2", "me:1:x", 60)
            await store.claim("r2", "them:2:y", 60, force=True)
            with pytest.raises(ClaimLost, match="moved to owner them:2:y"):
                await continue_claimed(store, "r2", "me:1:x", workflow=wf)
            assert gen == 1
        finally:
            await store.close()

    asyncio.run(main())


WAITER = '''
import asyncio, os
from pathlib import Path

async def wait(state, ctx):
    d = Path(os.environ["CLAIM_DIR"])
    (d / "waiting.tmp").write_text(ctx.run_id)  # renamed whole: never seen empty
    (d / "waiting.tmp").rename(d / "waiting")
    while not (d / "go").exists():
        await asyncio.sleep(0.02)
    await ctx.once("effect", lambda: (d / "effect").write_text("done"))
    return {"n": 1}
'''


def test_interlock_run_is_told_its_run_moved_to_another_owner(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys
    import time

    (tmp_path / "claimnodes.py").write_text(WAITER)
    (tmp_path / "flow.yaml").write_text(
        "workflow: waiter\ninput: [n]\nnodes:\n  wait: claimnodes:wait\n"
        "edges:\n  - {from: START, to: wait}\n  - {from: wait, to: END}\n")
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    repo = str(Path(interlock.__file__).resolve().parent.parent)
    env = {**os.environ, "CLAIM_DIR": str(tmp_path),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), repo])}
    proc = subprocess.Popen([sys.executable, "-m", "interlock", "run", "flow.yaml", "--store",
                             url, "--input", '{"n": 0}'], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "waiting").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        run_id = (tmp_path / "waiting").read_text()

        async def take() -> None:
            async with open_store(url) as st:
                await st.claim(run_id, "other-host:1:x", 60, force=True)

        asyncio.run(take())
        (tmp_path / "go").write_text("")  # the node goes on: its effect must not run
        _, err = proc.communicate(timeout=60)  # the keeper's renewal finds the claim gone
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 2, err
    assert f"run {run_id!r} moved to owner other-host:1:x (claim generation 2)" in err
    assert not (tmp_path / "effect").exists()


def _lease_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("interlock-lease:")}


def _one_node() -> interlock.Workflow:
    wf = interlock.Workflow("short", input=["n"])
    wf.node("one", lambda state: {"n": state["n"] + 1})
    wf.edge("START", "one")
    wf.edge("one", "END")
    return wf


def test_in_memory_runs_share_one_lease_thread() -> None:
    """Runs on stores of their own (``wf.run(store="memory://")`` makes a new store per
    run) are renewed by one keeper thread: with a thread per store, 200 concurrent runs
    left 200 threads alive for `_lease.IDLE_SECONDS` after them, and a process's memory
    and throughput went down with every batch."""
    wf = _one_node()

    async def batch() -> list[interlock.RunResult]:
        return await asyncio.gather(*(wf.run({"n": 0}, store="memory://")
                                      for _ in range(200)))

    before = _lease_threads()  # (other tests' stores' threads, idle for a while yet)
    results = asyncio.run(batch())
    assert [r.state["n"] for r in results] == [1] * 200
    started = _lease_threads() - before
    assert len(started) <= 1, sorted(t.name for t in started)


def test_a_loop_of_run_sync_on_sqlite_leaves_one_lease_thread(tmp_path: Path) -> None:
    """``wf.run_sync(store="sqlite:///...")`` opens the store for each run (each call is
    an event loop of its own): a script doing that in a loop started a keeper thread per
    run, each alive for `_lease.IDLE_SECONDS` after it."""
    wf = _one_node()
    before = _lease_threads()
    for _ in range(30):
        assert wf.run_sync({"n": 0}, store=f"sqlite:///{tmp_path / 'runs.db'}").state["n"] == 1
    started = _lease_threads() - before
    assert len(started) <= 1, sorted(t.name for t in started)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_one_keeper_renews_the_leases_of_several_stores(kind: str, tmp_path: Path) -> None:
    """The thread of a kind of store keeps a renewer per store: each store's lease is
    renewed on that store, a claim lost on one is told to that run only, and the renewer
    of a store whose runs are done is closed while another store's run goes on."""
    stores = [MemoryStore() if kind == "memory" else
              open_store(f"sqlite:///{tmp_path / f'runs{k}.db'}") for k in range(3)]
    keeper = _lease.keeper_for(stores[0])
    assert keeper is not None
    assert all(_lease.keeper_for(s) is keeper for s in stores)
    wf = _workflow({}, asyncio.Event(), asyncio.Event())
    lost = threading.Event()
    told: list[str] = []

    def on_lost(exc: ClaimLost) -> None:
        told.append(exc.run_id)
        lost.set()

    async def claim(s: Store, run_id: str) -> int:
        await wf.submit({"n": 0}, store=s, run_id=run_id)
        return await s.claim(run_id, "me", 0.6)

    held = [keeper.hold(s, f"r{k}", Claim("me", asyncio.run(claim(s, f"r{k}"))), 0.6,
                        on_lost) for k, s in enumerate(stores)]
    first = held[0].renewed
    asyncio.run(stores[1].claim("r1", "other", 30.0, force=True))  # r1 taken over
    try:
        assert lost.wait(10), "the keeper never found r1's claim gone"
        assert asyncio.run(stores[0].get_run("r0")).owner == "me"
        keeper.drop(held[2])  # r2's run is done: its store's renewer goes
        deadline = time.monotonic() + 10
        while (held[0].renewed == first or stores[2] in keeper._renewers) \
                and time.monotonic() < deadline:
            time.sleep(0.02)  # (r0's next renewals: every third of its lease)
    finally:
        for h in held:
            keeper.drop(h)
        for s in stores:
            asyncio.run(s.close())
    assert told == ["r1"] and held[1].lost is not None
    assert held[0].lost is None and held[0].renewed > first, "r0's lease was not renewed"
    assert stores[2] not in keeper._renewers, "the done store's renewer was kept open"
