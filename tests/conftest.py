"""Helpers the test modules share.

`CliProject`: a scratch directory (the working directory of the test) with a node
module, workflow files and a SQLite store, driven through the CLI in process. Each
module passes its own node code to the `make_project` fixture.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import sqlite3
import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from fake_openai import FakeOpenAI

import interlock
from interlock.cli import cli


def record_row(run_id: str, seq: int) -> str:
    """SQL for the id of record ``seq`` of ``run_id`` in a SQLite store's ``entries`` table
    (schema 2 keys a record by its run's number and its seq), for a test that changes a
    stored record as someone with write access to the file would."""
    assert "'" not in run_id
    return f"(SELECT run_key << 32 | {int(seq)} FROM runs WHERE run_id = '{run_id}')"


class CliProject:
    """A scratch directory with a node module, workflow files and a SQLite store.

    ``{mod}`` in a workflow's text names the node module.
    """

    def __init__(self, root: Path, nodes: str, prefix: str = "nodes") -> None:
        self.root = root
        self.mod = f"{prefix}_{uuid.uuid4().hex[:10]}"
        (root / f"{self.mod}.py").write_text(nodes)
        importlib.invalidate_caches()
        self.db = root / "runs.db"
        self.store = f"sqlite:///{self.db}"  # tmp_path is absolute: sqlite:////...

    def workflow(self, text: str, name: str = "wf.yaml") -> str:
        (self.root / name).write_text(textwrap.dedent(text).replace("{mod}", self.mod))
        return name

    def cli(self, *args: str, env: dict[str, str] | None = None) -> Result:
        return CliRunner().invoke(cli, [*args, "--store", self.store], env=env,
                                  catch_exceptions=False)

    def cli_json(self, *args: str) -> tuple[Result, Any]:
        result = self.cli(*args, "--json")
        return result, json.loads(result.stdout)  # exactly one JSON document on stdout

    def start(self, workflow: str, run_id: str, env: dict[str, str] | None = None) -> Result:
        return self.cli("run", self.workflow(workflow), "--run-id", run_id, env=env)

    def executions(self) -> list[str]:
        log = self.root / "executions.log"
        return log.read_text().split() if log.exists() else []

    def records(self, run_id: str) -> list[dict[str, Any]]:
        result, records = self.cli_json("trace", run_id)
        assert result.exit_code == 0, result.output
        assert isinstance(records, list)
        return records

    def sql(self, query: str, *args: Any) -> list[Any]:
        """A statement on the store's file, as someone with write access to it would."""
        with sqlite3.connect(self.db) as conn:
            return conn.execute(query, args).fetchall()

    def seqs(self, run_id: str) -> list[int]:
        return [s for (s,) in self.sql("SELECT seq FROM records WHERE run_id = ? ORDER BY seq",
                                       run_id)]


@pytest.fixture
def make_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                 ) -> Iterator[Callable[..., CliProject]]:
    """``make_project(nodes)``: a `CliProject` in ``tmp_path``, which becomes the working
    directory (call paths resolve from it), with no store or log key from the outside."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("INTERLOCK_STORE", raising=False)
    monkeypatch.delenv("INTERLOCK_LOG_KEY", raising=False)
    made: list[CliProject] = []

    def make(nodes: str, prefix: str = "nodes") -> CliProject:
        made.append(CliProject(tmp_path, nodes, prefix))
        return made[-1]

    yield make
    for p in made:
        sys.modules.pop(p.mod, None)


@pytest.fixture
def llm(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAI]:
    """The local OpenAI-compatible test server, with a dummy key in the environment."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    fake = FakeOpenAI()
    try:
        yield fake
    finally:
        fake.close()


def trace(run_id: str, store: str) -> list[dict[str, Any]]:
    """A stored run's records (``interlock.trace``)."""
    return asyncio.run(interlock.trace(run_id, store=store))


# log format 2's ``node.visited`` is a visit's start and its completion in one record
_VISITED_IS = ("node.started", "node.completed")


def records(run_id: str, store: str, rtype: str) -> list[dict[str, Any]]:
    """A stored run's records of type ``rtype``, as log format 1 has them: with those
    format 2 implies (trace's ``implies``), and a ``node.visited`` taken for a
    ``node.started`` and a ``node.completed``."""
    return [r for rec in trace(run_id, store) for r in (rec, *rec.get("implies", ()))
            if r["type"] == rtype or (r["type"] == "node.visited" and rtype in _VISITED_IS)]
