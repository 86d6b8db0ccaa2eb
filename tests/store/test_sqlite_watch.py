"""The SQLite store's change detector (`interlock._store._sqlite_watch`, issue 34): a
commit by another process wakes `Store.wait_changed`, and one made while nobody was
waiting is not lost (the count moved: the next wait returns at once)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import interlock

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


def test_commits_of_another_process_are_seen(tmp_path: Path) -> None:
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
        finally:
            await store.close()

    asyncio.run(main())
