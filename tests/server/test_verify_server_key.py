"""``interlock verify --server`` and the server's own log key (review 40, finding 3): a
server with INTERLOCK_LOG_KEY checks a run whose log is not keyed (written before the
key was set) as a plain chain and says so -- "not verified as keyed", what was checked,
exit 1 -- instead of advising to unset its key (a restart); and the client's own key,
which plays no part in the server's check, is said to be unused on every outcome."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import record_row
from test_server import Served, pythonpath

import interlock

pytest.importorskip("fastapi")

SERVER_KEY = "k" * 32
FLOW = """\
workflow: plain
nodes:
  first: vknodes:first
edges:
  - {from: START, to: first}
  - {from: first, to: END}
"""


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("INTERLOCK_STORE", "INTERLOCK_LOG_KEY"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "vknodes.py").write_text("def first(state):\n    return {'a': 1}\n")
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "plain.yaml").write_text(FLOW)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def verify(root: Path, *args: str, key: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "INTERLOCK_LOG_KEY"}
    env["PYTHONPATH"] = pythonpath(root)
    if key is not None:
        env["INTERLOCK_LOG_KEY"] = key
    return subprocess.run([sys.executable, "-m", "interlock", "verify", *args], cwd=root,
                          capture_output=True, text=True, timeout=60, env=env)


def test_a_keyed_server_checks_a_plain_log_and_says_what_it_checked(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = f"sqlite:///{root / 'runs.db'}"
    wf = interlock.load(str(root / "flows" / "plain.yaml"))
    assert wf.run_sync({}, store=store, run_id="before").status == "COMPLETED"  # no key
    monkeypatch.setenv("INTERLOCK_LOG_KEY", SERVER_KEY)  # the server's, from now on
    served = Served(root)
    try:
        with served.client() as c:
            r = c.post("/api/workflows/plain/runs", json={"input": {}, "run_id": "after"})
            assert r.status_code == 201, r.text
            answer = c.get("/api/runs/before/verify").json()
            assert answer["ok"] is False and answer["seq"] is None
            assert answer["records"] > 0 and answer["keyed"] is False
            assert answer["message"].startswith("plain chain intact, not keyed: run "
                                                "'before' was written without "
                                                "INTERLOCK_LOG_KEY")
            assert "anyone with write access to the store could have rewritten it" \
                in answer["message"]
        monkeypatch.delenv("INTERLOCK_LOG_KEY")
        out = verify(root, "before", "--server", served.url)
        assert out.returncode == 1, out.stdout + out.stderr
        first, *rest = out.stdout.splitlines()
        assert first.startswith("not verified as keyed: before (")
        assert "unset INTERLOCK_LOG_KEY" not in out.stdout  # (a server cannot)
        assert rest[-1] == ("to check it here, with no key (the log is not keyed): "
                            f"`interlock export before --server {served.url} > before.jsonl "
                            "&& interlock verify --file before.jsonl`")
        assert "was not used" not in out.stdout  # this client has no key
        # a client with a key of its own -- a wrong one -- is told it was not used,
        # on the plain outcome and on an "ok"
        wrong = "w" * 32
        out = verify(root, "before", "--server", served.url, key=wrong)
        assert out.returncode == 1
        assert "your INTERLOCK_LOG_KEY was not used: the server checked with its own" \
            in out.stdout
        assert out.stdout.rstrip().endswith("verify --file before.jsonl` with "
                                            "INTERLOCK_LOG_KEY unset")
        # ... and the hint works: the export, checked here with no store and no key
        export = subprocess.run(
            [sys.executable, "-m", "interlock", "export", "before", "--server", served.url],
            cwd=root, capture_output=True, timeout=60,
            env={**{k: v for k, v in os.environ.items() if k != "INTERLOCK_LOG_KEY"},
                 "PYTHONPATH": pythonpath(root)})
        assert export.returncode == 0, export.stderr
        (root / "before.jsonl").write_bytes(export.stdout)
        out = verify(root, "--file", "before.jsonl")
        assert out.returncode == 0 and out.stdout.startswith("ok: before ("), out.stdout
        out = verify(root, "after", "--server", served.url, key=wrong)
        assert out.returncode == 0, out.stdout + out.stderr
        assert out.stdout.startswith("ok: after (")
        assert "keyed chain (HMAC-SHA-256)" in out.stdout
        assert out.stdout.splitlines()[1] == ("your INTERLOCK_LOG_KEY was not used: the "
                                              "server checked with its own")
    finally:
        served.stop()
    # a local verify keeps its rule: with a key set, a plain log is not checked
    out = verify(root, "before", "--store", store, key=SERVER_KEY)
    assert out.returncode == 1
    assert "unset INTERLOCK_LOG_KEY to check its plain chain" in out.stdout
    assert "its records were not checked" in out.stdout


def test_a_plain_log_changed_in_the_store_is_broken_on_a_keyed_server(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sqlite3

    store = f"sqlite:///{root / 'runs.db'}"
    wf = interlock.load(str(root / "flows" / "plain.yaml"))
    assert wf.run_sync({}, store=store, run_id="old").status == "COMPLETED"
    db = sqlite3.connect(root / "runs.db")
    with db:  # someone with write access to the file edits the node's update
        rows = [(seq, db.execute(f"SELECT data FROM entries WHERE id = "
                                 f"{record_row('old', seq)}").fetchone()) for seq in range(1, 6)]
        [(seq, (data,))] = [(s, r) for s, r in rows if r and '"a":1' in r[0]]
        db.execute(f"UPDATE entries SET data = ? WHERE id = {record_row('old', seq)}",
                   (data.replace('"a":1', '"a":2'),))
    db.close()
    monkeypatch.setenv("INTERLOCK_LOG_KEY", SERVER_KEY)
    served = Served(root)
    try:
        with served.client() as c:
            answer = c.get("/api/runs/old/verify").json()
    finally:
        served.stop()
    assert answer["ok"] is False and answer["seq"] == seq, answer
