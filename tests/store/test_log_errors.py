"""Errors for their audience (issue 26): a broken log is a `LogError` (a `StoreError`),
not a `UsageError` -- the server answers 409 with what to do, never 400, and the CLI
exits 1 as `verify` does; a lost race stays a `ConflictError`; every error class a
user catches is exported by ``interlock``."""

from __future__ import annotations

import asyncio
import inspect
import sqlite3
from pathlib import Path

import pytest

import interlock
from interlock import _errors
from interlock import _log as L
from interlock._store import open_store


def test_every_error_class_is_exported_by_interlock() -> None:
    """`_errors`' docstring: every class a user catches is exported by ``interlock``."""
    classes = {name for name, obj in vars(_errors).items()
               if inspect.isclass(obj) and issubclass(obj, BaseException)
               and obj.__module__ == _errors.__name__}
    internal = {"NodeTimeout"}  # the engine's own signal: it never leaves the engine
    missing = sorted(classes - internal - set(interlock.__all__))
    assert not missing, f"add {missing} to interlock/__init__.py (__all__ and _WHERE)"
    for name in sorted(classes - internal):
        assert getattr(interlock, name) is getattr(_errors, name)
    assert issubclass(interlock.LogError, interlock.StoreError)
    assert not issubclass(interlock.LogError, ValueError)  # not "called wrongly"
    assert issubclass(interlock.ChildRunError, interlock.NodeError)
    from interlock.support import Draining

    assert Draining is interlock.Draining


def _gated(tmp_path: Path) -> tuple[interlock.Workflow, str, str]:
    wf = interlock.Workflow("tampered")
    wf.node("a", lambda s: {"x": 1}).approval("gate").node("b", lambda s: {"y": 2})
    wf.edge(interlock.START, "a").edge("a", "gate").edge("gate", "b")
    url = f"sqlite:///{tmp_path}/runs.db"
    run_id = wf.run_sync(store=url).run_id
    return wf, url, run_id


def test_a_changed_definition_is_a_log_error_that_says_what_to_do(tmp_path: Path) -> None:
    wf, url, run_id = _gated(tmp_path)
    with sqlite3.connect(tmp_path / "runs.db") as db:
        db.execute("UPDATE runs SET definition_hash = ? WHERE run_id = ?", ("0" * 64, run_id))
    with pytest.raises(interlock.LogError, match=r"does not match the hash .* `interlock "
                       rf"verify {run_id}`") as caught:
        asyncio.run(interlock.status(run_id, store=url))
    assert not isinstance(caught.value, interlock.UsageError)
    with pytest.raises(interlock.LogError):
        asyncio.run(wf.resume(run_id, interlock.approve(by="a"), store=url))


def test_a_broken_chain_is_a_log_error_naming_verify(tmp_path: Path) -> None:
    _, url, run_id = _gated(tmp_path)
    with sqlite3.connect(tmp_path / "runs.db") as db:
        db.execute("UPDATE entries SET data = replace(data, '\"x\":1', '\"x\":2') WHERE "
                   "data LIKE '%\"x\":1%'")
    with pytest.raises(interlock.LogError, match=rf"broken at record .* `interlock verify "
                       rf"{run_id}` shows where the chain breaks") as caught:
        asyncio.run(interlock.status(run_id, store=url))
    assert caught.value.run_id == run_id
    assert not asyncio.run(interlock.verify(run_id, store=url)).ok


def test_a_lost_race_in_drive_stays_a_conflict_error(tmp_path: Path) -> None:
    """`drive` committing its first batch after another writer: a `ConflictError` (a
    race; the server's 409), not a `UsageError` (test_stale_resume.py has the full race)."""
    _, url, run_id = _gated(tmp_path)

    async def main() -> None:
        st = open_store(url)
        try:
            loaded = await interlock.support.load_run(st, run_id)
            stale = loaded.writer()
            await interlock.support.append_note(run_id, "note.taken", {"n": 1}, store=st)
            from interlock._ops._execute import drive

            with pytest.raises(interlock.ConflictError, match="changed after this process "
                               "read it") as caught:
                await drive(loaded.plan, st, run_id, loaded.view, stale,
                            first=[(L.RUN_RESUMED, {"by": None})], execute=False)
            assert not isinstance(caught.value, interlock.UsageError)
        finally:
            await st.close()

    asyncio.run(main())


def test_the_server_answers_409_to_a_broken_log_never_400(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from interlock.server import ServerOptions, create_app

    _, url, run_id = _gated(tmp_path)
    with sqlite3.connect(tmp_path / "runs.db") as db:
        db.execute("UPDATE runs SET definition_hash = ? WHERE run_id = ?", ("0" * 64, run_id))
    flow = tmp_path / "tampered.yaml"
    flow.write_text("workflow: other\nnodes:\n  gate: {approval: {}}\nedges:\n"
                    "  - {from: START, to: gate}\n")
    app = create_app(ServerOptions(store=url, workflows=[str(flow)]))
    with TestClient(app, base_url="http://127.0.0.1") as c:
        for response in (c.get(f"/api/runs/{run_id}"),
                         c.post(f"/api/runs/{run_id}/decisions",
                                json={"decision": "approve", "by": "alice"})):
            assert response.status_code == 409, response.text
            assert response.headers["content-type"] == "application/problem+json"
            assert f"`interlock verify {run_id}`" in response.json()["detail"]


def test_the_cli_exits_1_on_a_broken_log_saying_what_to_do(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from interlock.cli import cli

    _, url, run_id = _gated(tmp_path)
    with sqlite3.connect(tmp_path / "runs.db") as db:
        db.execute("UPDATE runs SET definition_hash = ? WHERE run_id = ?", ("0" * 64, run_id))
    out = CliRunner().invoke(cli, ["status", run_id, "--store", url])
    assert out.exit_code == 1, out.output
    assert out.output.startswith("error: ") and f"`interlock verify {run_id}`" in out.output
