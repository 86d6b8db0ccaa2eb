"""``interlock export RUN_ID --server URL``: a run exported through a server
(``GET /api/runs/{id}/export``) is the same evidence as an export from its store --
the same bytes, checked by ``verify --file`` with no store and no server (with the key
where the log is keyed) -- and a run the server does not have is refused (exit 2)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from _harness import cli_root
from _workflows import TINY_NODES, tiny
from click.testing import CliRunner, Result
from conftest import record_row
from test_server import Served

pytest.importorskip("fastapi")

from interlock.cli import cli

KEY = "the auditors' key"


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return cli_root(tmp_path, monkeypatch, {"exnodes": TINY_NODES}, {"tiny": tiny("exnodes")})


@pytest.fixture
def served(root: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    store = f"sqlite:///{root / 'runs.db'}"
    flow = str(root / "flows" / "tiny.yaml")
    assert run("run", flow, "--run-id", "plain", "--store", store).exit_code == 0
    assert run("run", flow, "--run-id", "keyed", "--store", store,
               env={"INTERLOCK_LOG_KEY": KEY}).exit_code == 0
    monkeypatch.setenv("INTERLOCK_LOG_KEY", KEY)  # the server's environment, not ours
    server = Served(root)
    monkeypatch.delenv("INTERLOCK_LOG_KEY")
    try:
        yield server
    finally:
        server.stop()


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def test_an_export_through_the_server_is_the_stores_export_and_verifies_offline(
        root: Path, served: Served) -> None:
    store = f"sqlite:///{root / 'runs.db'}"
    for run_id, env in (("plain", None), ("keyed", {"INTERLOCK_LOG_KEY": KEY})):
        remote = run("export", run_id, "--server", served.url)
        assert remote.exit_code == 0, remote.output
        local = run("export", run_id, "--store", store, env=env)
        assert local.exit_code == 0, local.output
        assert remote.stdout_bytes == local.stdout_bytes  # the same evidence
        (root / f"{run_id}.jsonl").write_bytes(remote.stdout_bytes)
        checked = run("verify", "--file", f"{run_id}.jsonl", env=env)
        assert checked.exit_code == 0, checked.output
        assert checked.stdout.startswith(f"ok: {run_id} (5 records")
    # the keyed export checked without the key: not verified, as any keyed log is
    assert run("verify", "--file", "keyed.jsonl").exit_code == 1


def test_a_run_the_server_lacks_is_refused_and_a_tampered_one_is_said(
        root: Path, served: Served) -> None:
    missing = run("export", "nope", "--server", served.url)
    assert missing.exit_code == 2
    assert "no run 'nope'" in missing.stderr and not missing.stdout_bytes
    with served.client() as c:  # the API's answer: problem+json, before any line
        answer = c.get("/api/runs/nope/export")
    assert answer.status_code == 404
    assert answer.headers["content-type"].startswith("application/problem+json")

    with sqlite3.connect(root / "runs.db") as conn:  # someone edits a stored record
        (data,) = conn.execute(f"SELECT data FROM entries WHERE id = "
                               f"{record_row('keyed', 4)}").fetchone()
        conn.execute(f"UPDATE entries SET data = ? WHERE id = {record_row('keyed', 4)}",
                     (data.replace('"x":1', '"x":7'),))
    tampered = run("export", "keyed", "--server", served.url)
    assert tampered.exit_code == 1  # written all the same: it is what the store holds
    assert b'"x":7' in tampered.stdout_bytes
    assert "does not verify at record 4" in tampered.stderr
    (root / "keyed.jsonl").write_bytes(tampered.stdout_bytes)
    assert run("verify", "--file", "keyed.jsonl",
               env={"INTERLOCK_LOG_KEY": KEY}).stdout.startswith("broken: keyed")
