"""Closing the child runs nothing waits for (`_ops._orphans`) while the store fails.

A parent rejected closes the children it waited through, and theirs. When the store
refuses the child's records, the parent's rejection stands (its decider is not told of
a failure that is not theirs), the child is left whole -- waiting as it was, none of its
closing records stored, its claim given back -- a warning names the child and its
parent, and the next look at the waiting runs (``runs --waiting``, the server's inbox)
finishes it, down to the grandchild. The store's failures are injected with
`interlock.testing.FaultyStore`, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import CliProject
from test_child_gates import GRANDCHILD, MIDDLE, NODES, TOP
from test_store_conformance import pg_schema_url  # noqa: F401 (a fixture)

import interlock
from interlock._engine import _journal
from interlock._ops import _orphans
from interlock.cli import cli
from interlock.server._reads import Approvals
from interlock.testing import FaultyStore

PARENT, CHILD, GRANDKID = "rj", "rj.remediate.1", "rj.remediate.1.fix.1"
HANG = 60.0  # the guard of a look that does not finish (not a timing)


@pytest.fixture(autouse=True)
def short_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed append is tried again for 0.3 s (10 s by default), to keep tests short."""
    monkeypatch.setattr(_journal, "RETRY_SECONDS", 0.3, raising=False)


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'runs.db'}"
    found: str = request.getfixturevalue("pg_schema_url")
    return found


def _cli(url: str, *args: str) -> Any:
    return CliRunner().invoke(cli, [*args, "--store", url], catch_exceptions=False)


def _status(url: str, run_id: str) -> str:
    return str(json.loads(_cli(url, "status", run_id, "--json").stdout)["status"])


def _waiting(make_project: Callable[..., CliProject], url: str) -> None:
    """The parent waits at ``legal`` and, through ``remediate``, at its child's gate
    ``b`` and its grandchild's ``approval``."""
    p = make_project(NODES)
    p.workflow(GRANDCHILD, "grandchild.yaml")
    p.workflow(MIDDLE, "middle.yaml")
    assert _cli(url, "run", p.workflow(TOP, "top.yaml"), "--run-id", PARENT).exit_code == 3
    for run in (CHILD, GRANDKID):
        assert _status(url, run) == "WAITING_APPROVAL"


def _of(run_id: str) -> Callable[..., bool]:
    """A fault's ``when``: the call is about ``run_id`` (its first argument)."""
    return lambda rid, *args, **kwargs: rid == run_id


async def _seqs(store: FaultyStore, run_id: str) -> list[int]:
    return [e.seq for e in await store.inner.entries(run_id)]


async def _reject_while_the_child_fails(store: FaultyStore, *methods: str) -> list[int]:
    """``legal`` rejected while every call of ``methods`` about the child fails: the
    parent ends REJECTED all the same; the child's log is unchanged (returned)."""
    before = await _seqs(store, CHILD)
    store.fail(*methods, when=_of(CHILD), times=None)
    done = await asyncio.wait_for(interlock.resume(
        PARENT, interlock.reject(by="lu", node="legal"), store=store), HANG)
    assert done.status == "REJECTED"
    assert (await store.inner.get_run(CHILD)).summary.status == "WAITING_APPROVAL"
    assert await _seqs(store, CHILD) == before  # none of its closing records stored
    assert (await store.inner.get_run(GRANDKID)).summary.status == "WAITING_APPROVAL"
    store.heal()
    return before


def _said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING
            and "could not be closed" in r.getMessage()]


def _closed_whole(url: str) -> None:
    for run in (CHILD, GRANDKID):
        assert _status(url, run) == "REJECTED"
        assert _cli(url, "verify", run).exit_code == 0
    assert json.loads(_cli(url, "runs", "--waiting", "--json").stdout) == []


def test_a_child_whose_records_are_refused_is_left_whole_and_the_next_look_closes_it(
        make_project: Callable[..., CliProject], url: str,
        caplog: pytest.LogCaptureFixture) -> None:
    _waiting(make_project, url)

    async def main() -> None:
        store = FaultyStore(interlock.open_store(url))
        try:
            await _reject_while_the_child_fails(store, "append")
            # its claim was given back: the next look claims it at once
            assert (await store.inner.get_run(CHILD)).owner is None
            assert await asyncio.wait_for(interlock.list_runs(
                store=store, status="WAITING_APPROVAL"), HANG) == []
        finally:
            await store.close()

    asyncio.run(main())
    [said] = _said(caplog)
    assert f"child run {CHILD} of run {PARENT}" in said and "next look" in said
    assert "FaultyStore: append failed" in said  # what the store said ...
    assert "interlock resume" not in said  # ... not the journal's advice for a run
    _closed_whole(url)


def test_a_child_whose_claim_is_not_given_back_is_closed_once_its_lease_runs_out(
        make_project: Callable[..., CliProject], url: str,
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store down for the child (its records and the release of its claim refused):
    the warning says why the child was not closed (the append, not the release), and
    the looks made while the claim's lease lasts leave it waiting -- not "closed" by a
    cancellation asked of an executor that does not exist; then a look closes it."""
    monkeypatch.setattr(_orphans, "LEASE_SECONDS", 1.0)
    _waiting(make_project, url)

    async def main() -> None:
        store = FaultyStore(interlock.open_store(url))
        try:
            await _reject_while_the_child_fails(store, "append", "release")
            assert (await store.inner.get_run(CHILD)).owner is not None  # a lease left
            async with asyncio.timeout(HANG):
                while await interlock.list_runs(store=store, status="WAITING_APPROVAL"):
                    await asyncio.sleep(0.1)
        finally:
            await store.close()

    asyncio.run(main())
    said = _said(caplog)[0]
    assert "FaultyStore: append failed" in said, said
    _closed_whole(url)


def test_the_servers_inbox_closes_a_child_it_failed_to_close_at_its_next_look(
        make_project: Callable[..., CliProject], url: str) -> None:
    """The inbox looks at a stranded child again only when its parent has moved -- but
    a look whose close failed must be made again, though the parent (ended) never
    moves: else the child shows in ``/api/approvals`` until the server restarts."""
    _waiting(make_project, url)
    inbox = Approvals()

    async def main() -> None:
        store = FaultyStore(interlock.open_store(url))
        try:
            await _reject_while_the_child_fails(store, "append")
            fault = store.fail("append", when=_of(CHILD), times=None)
            listed = await asyncio.wait_for(inbox.list(store), HANG)
            assert fault.hits and CHILD in {a["run_id"] for a in listed}
            store.heal()
            assert await asyncio.wait_for(inbox.list(store), HANG) == []
        finally:
            await store.close()

    asyncio.run(main())
    _closed_whole(url)


def test_the_servers_inbox_looks_again_when_the_parent_could_not_be_read(
        make_project: Callable[..., CliProject], url: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """A stranded child whose parent's log the store fails to give: not closed at that
    look (said), and closed at the next -- not forgotten until the parent moves."""
    _waiting(make_project, url)
    inbox = Approvals()

    async def main() -> None:
        store = FaultyStore(interlock.open_store(url))
        try:
            await _reject_while_the_child_fails(store, "append")  # stranded
            store.fail("entries", "entries_page", "load_snapshot", when=_of(PARENT),
                       times=None)
            assert CHILD in {a["run_id"] for a in await asyncio.wait_for(
                inbox.list(store), HANG)}
            store.heal()
            assert await asyncio.wait_for(inbox.list(store), HANG) == []
        finally:
            await store.close()

    asyncio.run(main())
    assert any(f"the parent run {PARENT} of waiting run {CHILD} could not be read" in m
               for m in (r.getMessage() for r in caplog.records))
    _closed_whole(url)
