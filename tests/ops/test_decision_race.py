"""Exactly one decision wins when two processes decide the same gate at the same moment.

Two real `interlock resume` processes are released together (a barrier on a pipe,
not a sleep) against a waiting run, on SQLite and on PostgreSQL: one decision is
recorded and followed, the other is refused (exit 2) with a clear reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKFLOW = """
workflow: race
nodes:
  gate: {approval: {show: []}}
  after: race_nodes:after
edges:
  - {from: START, to: gate}
  - {from: gate, to: after, when: 'gate.decision == "approved"'}
"""

NODES = """
def after(state):
    with open("after.txt", "a") as f:
        f.write("ran\\n")
    return {"after": True}
"""

# Waits for one byte on stdin (the start signal), then runs the CLI in-process.
LAUNCH = """
import sys
sys.stdin.buffer.read(1)
from interlock.cli import main
main(sys.argv[1:])
"""


def store_urls(tmp_path: Path) -> list[str]:
    urls = [f"sqlite:///{tmp_path}/runs.db"]
    pg = os.environ.get("INTERLOCK_TEST_POSTGRES")
    if pg:
        urls.append(pg)
    elif os.environ.get("CI"):
        pytest.fail("INTERLOCK_TEST_POSTGRES is not set in CI: the PostgreSQL race must run")
    return urls


def test_two_processes_deciding_at_once_one_wins(tmp_path: Path) -> None:
    (tmp_path / "race.yaml").write_text(WORKFLOW)
    (tmp_path / "race_nodes.py").write_text(NODES)
    env = dict(os.environ)
    for n, store in enumerate(store_urls(tmp_path)):
        for round_ in range(3):
            run_id = f"race-{n}-{round_}-{os.getpid()}"
            started = subprocess.run(
                [sys.executable, "-m", "interlock", "run", "race.yaml", "--store", store,
                 "--run-id", run_id], cwd=tmp_path, env=env, capture_output=True, text=True,
                timeout=60)
            assert started.returncode == 3, started.stderr
            procs = [subprocess.Popen(
                [sys.executable, "-c", LAUNCH, "resume", run_id, flag, "--by", who,
                 "--store", store, "--json"], cwd=tmp_path, env=env, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for flag, who in (("--approve", "alice"), ("--reject", "bob"))]
            for p in procs:  # both are waiting on stdin: release them together
                assert p.stdin is not None
                p.stdin.write("x")
                p.stdin.flush()
            outs = [p.communicate(timeout=60) for p in procs]
            codes = sorted(p.returncode for p in procs)
            # the winner: approve -> 0 (completed) or reject -> 4 (rejected); the loser: 2
            assert codes in ([0, 2], [2, 4]), (codes, outs)
            loser = outs[[p.returncode for p in procs].index(2)][1]
            assert "refused" in loser or "being executed by" in loser or "not waiting" in loser
            trace = subprocess.run(
                [sys.executable, "-m", "interlock", "trace", run_id, "--store", store,
                 "--json"], cwd=tmp_path, env=env, capture_output=True, text=True,
                timeout=60)
            decided = [r for r in json.loads(trace.stdout) if r["type"] == "approval.decided"]
            assert len(decided) == 1
            verify = subprocess.run(
                [sys.executable, "-m", "interlock", "verify", run_id, "--store", store],
                cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
            assert verify.returncode == 0, verify.stdout
