"""The SQLite store's change detector (`interlock._store._sqlite_watch`, issue 34): a
commit by another process wakes `Store.wait_changed`, and one made while nobody was
waiting is not lost (the count moved: the next wait returns at once) -- told of the
file's writes by the kernel (Linux's inotify) or, where it cannot be, looking every
10 ms; told, a wait on a file nobody writes makes no look."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_store_conformance import new_row

import interlock
from interlock._store import _sqlite_watch
from interlock._store._file_events import FileEvents

FLOW = "workflow: one\nnodes:\n  go: wnodes:go\nedges:\n" \
       "  - {from: START, to: go}\n  - {from: go, to: END}\n"


def _other_process_runs(root: Path, url: str, run_id: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "interlock", "run", "one.yaml", "--run-id", run_id,
         "--store", url], cwd=root, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (str(root), str(Path(__file__).resolve().parents[2]),
                        os.environ.get("PYTHONPATH", "")) if p)})
    assert done.returncode == 0, done.stderr


@pytest.fixture(params=["told", "looking"])
def how(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """``told``: as the store runs here (on Linux, inotify); ``looking``: as where the
    kernel cannot tell (no inotify), a look every 10 ms."""
    if request.param == "looking":
        monkeypatch.setattr(FileEvents, "open", classmethod(lambda cls, *args: None))
    elif not sys.platform.startswith("linux"):
        pytest.skip("the kernel tells of writes on Linux only (inotify)")
    return str(request.param)


def test_commits_of_another_process_are_seen(tmp_path: Path, how: str) -> None:
    (tmp_path / "wnodes.py").write_text("def go(state):\n    return {'ok': True}\n")
    (tmp_path / "one.yaml").write_text(FLOW)
    url = f"sqlite:///{tmp_path / 'runs.db'}"

    async def main() -> None:
        store = interlock.open_store(url)
        try:
            # the first run creates the file: its appearance is a change too
            waiting = asyncio.ensure_future(store.wait_changed(60))
            await asyncio.sleep(0)  # (the wait begun before the other process starts)
            await asyncio.to_thread(_other_process_runs, tmp_path, url, "r1")
            seen = await waiting
            assert seen >= 1  # woken by the change, not the 60 s timeout
            # a commit while nobody waits (the detector still looks, 2 s after a wait)
            await store.wait_changed(0.01)
            seen = await store.wait_changed(0.01)
            await asyncio.to_thread(_other_process_runs, tmp_path, url, "r2")
            after = await store.wait_changed(60, seen)  # at once: the count moved
            assert after > seen
            assert (await store.get_run("r2")).summary.status == "COMPLETED"
            assert store._watch().told is (how == "told")
        finally:
            await store.close()

    asyncio.run(main())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux's")
def test_told_of_writes_a_wait_on_a_file_nobody_writes_makes_no_look(tmp_path: Path) -> None:
    """What an idle worker or a stream on a run no one executes costs: nothing ticks
    (looking every 10 ms, this half-second wait made ~50 looks: 2% of a core on this
    machine). A write made meanwhile is still seen."""
    url = f"sqlite:///{tmp_path / 'runs.db'}"

    async def main() -> None:
        store, other = interlock.open_store(url), interlock.open_store(url)
        try:
            await other.list_runs(limit=1)  # the file made
            await store.wait_changed(0.5)
            watch = store._watch()
            assert watch.told and watch.ticks <= 2
            seen = watch.count
            waiting = asyncio.ensure_future(store.wait_changed(60, seen))
            row, _, entries = new_row()
            await other.create_run(row, entries)
            assert await asyncio.wait_for(waiting, 30) > seen
        finally:
            await store.close()
            await other.close()

    assert _sqlite_watch.BURST < 0.5
    asyncio.run(main())
