"""Engine records a node may not write, and what every reader does with a forged one
(issue 26): ``child.`` and ``snapshot.`` (and ``notify.``) are interlock's own; a log
holding a child link the engine did not write -- one that names its own run, or a node
that is not a sub-workflow -- is reported by `verify` and never followed by `trace` or
`export`. And nothing follows the end of a run: not a second terminal record, not a
cancellation racing a completion.

The forged logs are written straight to the store and re-chained, so that every hash
verifies: what someone with write access to a plain-chained store can do.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import interlock
from interlock import START, Workflow
from interlock import _log as L
from interlock._store import RunRow, Store, open_store
from interlock.support import append_note, export_run, verify_export


def _store(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/runs.db"


# -- a node may not write the engine's records -------------------------------------------


@pytest.mark.parametrize("rtype", ["child.started", "snapshot.taken", "notify.sent"])
def test_a_node_logging_an_engine_record_type_is_refused(tmp_path: Path, rtype: str) -> None:
    async def forge(state: dict[str, Any], ctx: interlock.Context) -> dict[str, Any]:
        await ctx.log(rtype, {"run_id": ctx.run_id, "workflow": "loop"})
        return {}

    url = _store(tmp_path)
    result = Workflow("forger").node("forge", forge).edge(START, "forge").run_sync(store=url)
    assert result.status == "FAILED"
    message = result.error["message"]
    assert f"ctx.log: {rtype!r} is not a record type a node may write (node 'forge')" \
        in message and "child., " in message and "snapshot." in message
    records = asyncio.run(interlock.trace(result.run_id, store=url))
    assert rtype not in [r["type"] for r in records]
    assert asyncio.run(interlock.verify(result.run_id, store=url)).ok


# -- a hand-forged child link ------------------------------------------------------------


def _parent() -> Workflow:
    child = Workflow("child").node("fix", lambda s: {"fixed": True}).edge(START, "fix")
    wf = Workflow("parent").node("intake", lambda s: {"n": 1})
    wf.subworkflow("remediate", child, input={})
    return wf.edge(START, "intake").edge("intake", "remediate")


async def _forge(st: Store, source: str, new_id: str,
                 edit: Callable[[list[dict[str, Any]]], list[dict[str, Any]]],
                 parent: str | None = None) -> None:
    """A copy of ``source`` as a new run ``new_id``, its records edited, re-chained
    (plain SHA-256) and written straight to the store with a summary that matches."""
    row = await st.get_run(source)
    records = edit([e.record() for e in await st.entries(source)])
    entries, prev = [], L.GENESIS
    for seq, rec in enumerate(records, start=1):
        rec["seq"] = seq
        data = L.dumps(rec)
        prev = L.chain(prev, data)
        entries.append(L.Entry(seq, rec["type"], data, prev, rec.get("node")))
    status = L.TERMINAL_TYPES.get(records[-1]["type"], row.summary.status)
    summary = dataclasses.replace(row.summary, last_seq=len(entries), last_hash=prev,
                                  status=status)
    await st.create_run(RunRow(run_id=new_id, workflow=row.workflow,
                               definition=row.definition,
                               definition_hash=row.definition_hash, input=row.input,
                               options={**row.options, "parent": {"run": parent}}
                               if parent else row.options, created_at=row.created_at,
                               summary=summary), entries)


def _relink(to: str, node: str | None = None) -> Callable[[list[dict[str, Any]]],
                                                           list[dict[str, Any]]]:
    def edit(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for rec in records:
            if rec["type"] == "child.started":
                rec["run_id"] = to
                if node is not None:
                    rec["node"] = node
        return records
    return edit


def test_a_forged_child_link_to_its_own_run_is_reported_and_never_followed(
        tmp_path: Path) -> None:
    url = _store(tmp_path)
    done = _parent().run_sync(store=url, run_id="p1")
    assert done.status == "COMPLETED", done.error

    async def main() -> None:
        st = open_store(url)
        try:
            await _forge(st, "p1", "self", _relink("self"))
            # trace and export terminate, and nest nothing
            records = await asyncio.wait_for(interlock.trace("self", store=st), 30)
            [link] = [r for r in records if r["type"] == "child.started"]
            assert link["run_id"] == "self" and "records" not in link
            lines = await asyncio.wait_for(
                _collect(export_run("self", store=st)), 30)
            assert len(lines) == 1 + len(records)  # its header and its records, once
            result = await interlock.verify("self", store=st)
            assert not result.ok and result.run_id == "self"
            assert "names the run 'self', which holds it: a cycle" in result.message
            exported = verify_export(lines)
            assert not exported.ok and "a cycle" in exported.message
        finally:
            await st.close()

    asyncio.run(main())


def test_a_cycle_of_two_forged_runs_terminates_every_reader(tmp_path: Path) -> None:
    url = _store(tmp_path)
    assert _parent().run_sync(store=url, run_id="p1").status == "COMPLETED"

    async def main() -> None:
        st = open_store(url)
        try:
            # a links to b, b links back to a; b names a as its parent (so b nests)
            await _forge(st, "p1", "a", _relink("b"))
            await _forge(st, "p1", "b", _relink("a"), parent="a")
            records = await asyncio.wait_for(interlock.trace("a", store=st), 30)
            [link] = [r for r in records if r["type"] == "child.started"]
            [back] = [r for r in link["records"] if r["type"] == "child.started"]
            assert "records" not in back  # its link back to a is not followed again
            lines = await asyncio.wait_for(_collect(export_run("a", store=st)), 30)
            assert len([x for x in lines if x.startswith(b'{"format"')]) == 2  # a, b once
            result = await interlock.verify("a", store=st)
            assert not result.ok and result.run_id == "b" and "a cycle" in result.message
        finally:
            await st.close()

    asyncio.run(main())


def test_a_child_link_from_a_node_that_is_not_a_sub_workflow_is_reported(
        tmp_path: Path) -> None:
    """What a node could write before ``child.`` was reserved: a link to another run."""
    url = _store(tmp_path)
    assert _parent().run_sync(store=url, run_id="p1").status == "COMPLETED"
    other = Workflow("other").node("x", lambda s: {"x": 1}).edge(START, "x")
    assert other.run_sync(store=url, run_id="elsewhere").status == "COMPLETED"

    async def main() -> None:
        st = open_store(url)
        try:
            await _forge(st, "p1", "nested", _relink("elsewhere", node="intake"))
            records = await interlock.trace("nested", store=st)
            assert all("records" not in r for r in records)
            lines = await _collect(export_run("nested", store=st))
            assert b'"run_id":"elsewhere"' not in lines[0]  # not a child in the header
            result = await interlock.verify("nested", store=st)
            assert not result.ok
            assert "'intake', which is not a sub-workflow node" in result.message
        finally:
            await st.close()

    asyncio.run(main())


def test_the_real_child_link_is_still_followed(tmp_path: Path) -> None:
    url = _store(tmp_path)
    assert _parent().run_sync(store=url, run_id="p1").status == "COMPLETED"
    records = asyncio.run(interlock.trace("p1", store=url))
    [link] = [r for r in records if r["type"] == "child.started"]
    assert [r["type"] for r in link["records"]][-1] == "run.completed"
    result = asyncio.run(interlock.verify("p1", store=url))
    assert result.ok and result.children == ("p1.remediate.1",)
    lines = asyncio.run(_collect(export_run("p1", store=url)))
    assert verify_export(lines).ok


async def _collect(lines: Any) -> list[bytes]:
    return [line async for line in lines]


# -- nothing follows the end of a run ----------------------------------------------------


def test_a_terminal_record_after_a_terminal_one_is_reported_by_verify(tmp_path: Path) -> None:
    url = _store(tmp_path)
    done = Workflow("w").node("a", lambda s: {"a": 1}).edge(START, "a").run_sync(
        store=url, run_id="done")
    assert done.status == "COMPLETED"

    def cancelled_after(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [*records, {"type": "run.cancelled", "at": records[-1]["at"], "by": "x",
                           "node": None}]

    async def main() -> None:
        st = open_store(url)
        try:
            await _forge(st, "done", "twice", cancelled_after)
            result = await interlock.verify("twice", store=st)
            assert not result.ok and result.seq == len(await st.entries("done")) + 1
            assert "comes after the run ended (COMPLETED)" in result.message
            with pytest.raises(interlock.InternalError, match="after the run ended"):
                await interlock.status("twice", store=st)
        finally:
            await st.close()

    asyncio.run(main())


def test_cancel_refuses_a_run_that_completed_between_its_read_and_its_claim(
        tmp_path: Path) -> None:
    """The race: `cancel` reads the run (waiting), the run is approved and completes, then
    `cancel` claims it (the completion released the claim): it must re-check."""
    wf = Workflow("raced")
    wf.approval("gate").node("after", lambda s: {"after": True})
    wf.edge(START, "gate").edge("gate", "after")
    url = _store(tmp_path)
    run_id = wf.run_sync(store=url).run_id

    async def main() -> None:
        late = open_store(url)
        claim = late.claim

        async def claim_after_the_completion(*args: Any, **kw: Any) -> None:
            won = await wf.resume(run_id, interlock.approve(by="alice"), store=url)
            assert won.status == "COMPLETED"
            await claim(*args, **kw)

        late.claim = claim_after_the_completion  # type: ignore[method-assign]
        try:
            with pytest.raises(interlock.UsageError, match="is already COMPLETED"):
                await interlock.cancel(run_id, store=late)
            assert (await late.get_run(run_id)).owner is None  # the claim was released
        finally:
            await late.close()

    asyncio.run(main())
    records = asyncio.run(interlock.trace(run_id, store=url))
    assert records[-1]["type"] == "run.completed"
    assert "run.cancelled" not in [r["type"] for r in records]
    assert asyncio.run(interlock.verify(run_id, store=url)).ok
    assert asyncio.run(interlock.status(run_id, store=url)).status == "COMPLETED"


@pytest.mark.parametrize("rtype", ["notify.sent", "audit.note"])
def test_only_notify_sent_may_follow_a_run_s_final_record(tmp_path: Path, rtype: str) -> None:
    """A server's note that it told a chat may come after the end (the update after the
    click that ended the run, a retried delivery); any other record there is reported by
    `verify` and by `verify --file` of an export, and `append_note` refuses to write it."""
    url = _store(tmp_path)
    done = Workflow("w").node("a", lambda s: {"a": 1}).edge(START, "a").run_sync(
        store=url, run_id="done")
    assert done.status == "COMPLETED"
    note = {"via": "slack", "action": "update", "request": 1, "attempt": 1, "status": 200}

    def noted_after(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [*records, {"type": rtype, "at": records[-1]["at"], "node": None, **note}]

    async def main() -> None:
        st = open_store(url)
        try:
            await _forge(st, "done", "noted", noted_after)
            result = await interlock.verify("noted", store=st)
            exported = verify_export(await _collect(export_run("noted", store=st)))
            records = await interlock.trace("noted", store=st)
            assert records[-1]["type"] == rtype
            if rtype == "notify.sent":
                assert result.ok and exported.ok, (result, exported)
                await append_note("done", rtype, note, store=st)
                assert (await interlock.verify("done", store=st)).ok
            else:
                assert not result.ok and not exported.ok
                assert result.seq == len(await st.entries("done")) + 1
                assert f"the {rtype} record comes after the run ended (COMPLETED): only " \
                       "notify.sent may follow" in result.message
                with pytest.raises(interlock.UsageError, match="has ended"):
                    await append_note("done", rtype, note, store=st)
            assert (await interlock.status("noted", store=st)).status == "COMPLETED"
        finally:
            await st.close()

    asyncio.run(main())


def test_an_export_holds_the_records_its_header_counts(tmp_path: Path) -> None:
    """A notify.sent appended after an ended run's final record while its export is read
    (after the header, before the records) is left for the next export: the export
    verifies, as it did when nothing could follow the end."""
    url = _store(tmp_path)
    done = Workflow("w").node("a", lambda s: {"a": 1}).edge(START, "a").run_sync(
        store=url, run_id="done")
    note = {"via": "slack", "action": "update", "request": 1, "attempt": 1, "status": 200}

    async def main() -> None:
        st = open_store(url)
        iter_entries = st.iter_entries

        def late(run_id: str, **kw: Any) -> Any:
            async def pages() -> Any:
                st.iter_entries = iter_entries  # type: ignore[method-assign]
                await append_note(run_id, "notify.sent", note, store=st)  # lands now
                async for page in iter_entries(run_id, **kw):
                    yield page
            return pages()

        st.iter_entries = late  # type: ignore[method-assign]
        try:
            lines = await _collect(export_run("done", store=st))
            assert verify_export(lines).ok
            assert len(lines) == 1 + len(await st.entries("done")) - 1  # (not the note)
            again = await _collect(export_run("done", store=st))
            assert verify_export(again).ok and len(again) == len(lines) + 1
        finally:
            await st.close()

    assert done.status == "COMPLETED"
    asyncio.run(main())


def test_verify_reads_a_note_appended_after_the_end_while_it_reads(tmp_path: Path) -> None:
    """The summary is read before the records: a notify.sent appended in between (after
    an ended run's final record) is not a log that outgrew its summary."""
    url = _store(tmp_path)
    Workflow("w").node("a", lambda s: {"a": 1}).edge(START, "a").run_sync(
        store=url, run_id="done")
    note = {"via": "slack", "action": "update", "request": 1, "attempt": 1, "status": 200}

    async def main() -> None:
        st = open_store(url)
        iter_entries = st.iter_entries

        def late(run_id: str, **kw: Any) -> Any:
            async def pages() -> Any:
                st.iter_entries = iter_entries  # type: ignore[method-assign]
                await append_note(run_id, "notify.sent", note, store=st)  # lands now
                async for page in iter_entries(run_id, **kw):
                    yield page
            return pages()

        st.iter_entries = late  # type: ignore[method-assign]
        try:
            result = await interlock.verify("done", store=st)
            assert result.ok, result
            assert result.records == len(await st.entries("done"))  # the note too
        finally:
            await st.close()

    asyncio.run(main())
