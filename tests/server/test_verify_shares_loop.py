"""``GET /api/runs/{id}/verify`` checks a long log on the server's event loop, a page of
records at a time: it used to hash and fold each 2,000-record page without giving the
loop back, so a verify of a long log stalled every other request and event stream of
the server meanwhile (review 40). It now yields every few hundred records: here a
verify is held at such a point (`_verify._share`), and the server answers another
request while it waits -- no timing involved."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from test_token_order import InProcess

import interlock
from interlock._ops import _verify

pytest.importorskip("fastapi")

LOOP = """\
workflow: loop
nodes:
  step: {call: vlnodes:count, writes: [n]}
edges:
  - {from: START, to: step}
  - {from: step, to: step, when: 'n < 150'}
  - {from: step, to: END, otherwise: true}
"""


def test_a_long_verify_lets_the_server_answer_meanwhile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("INTERLOCK_LOG_KEY", raising=False)
    (tmp_path / "vlnodes.py").write_text("def count(state):\n    return {'n': state['n'] + 1}\n")
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "loop.yaml").write_text(LOOP)
    monkeypatch.syspath_prepend(str(tmp_path))
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    run = interlock.load(str(tmp_path / "flows" / "loop.yaml")).run_sync(
        {"n": 0}, store=store, run_id="long")
    assert run.status == "COMPLETED"

    paused, answered = threading.Event(), threading.Event()
    shares = 0

    async def held() -> None:  # the first yield waits until the test was answered
        nonlocal shares
        shares += 1
        if shares == 2:  # (past the first chunk: mid-log)
            paused.set()
            await asyncio.to_thread(answered.wait, 60)

    monkeypatch.setattr(_verify, "_share", held)
    server = InProcess(tmp_path, store=store)
    try:
        got: dict[str, Any] = {}

        def verify() -> None:
            with server.client() as c:
                got.update(c.get("/api/runs/long/verify").json())

        t = threading.Thread(target=verify)
        t.start()
        assert paused.wait(60), "the verify never gave the event loop back"
        try:
            with server.client() as c:
                assert c.get("/api/health").status_code == 200  # while it is held
                assert c.get("/api/runs/long").json()["status"] == "COMPLETED"
            assert not got  # (the verify has not answered yet)
        finally:
            answered.set()
        t.join(60)
    finally:
        server.stop()
    assert got["ok"] is True and got["records"] > 2 * _verify.SHARE_EVERY, got
    assert shares >= got["records"] // _verify.SHARE_EVERY
