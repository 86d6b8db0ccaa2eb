"""The chats' deliveries when the store refuses their record (`interlock.testing.
FaultyStore`): a post made whose ``notify.sent`` the store refused is owed still, and the
next look makes it again -- exactly once more, recorded then; the run's log is left as
it was (nothing half-written, nothing lost: it verifies, the gate still waits). A record
stored whose answer was lost (the commit went through; the journal's next try finds it
stored) is not made again: the log says it was done. In process, with a chat that
counts what it is asked to post."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from _workflows import one_gate

import interlock
from interlock.testing import FaultyStore

pytest.importorskip("httpx")

GATED = one_gate("chatted")


class _Chat:
    """A chat (`_chat.Chat`) that takes every post and counts them."""

    name = "fake"

    def __init__(self) -> None:
        self.posts: list[dict[str, Any]] = []

    def message(self, workflow: str, run_id: str, gate: str, rec: dict[str, Any],
                public_url: str) -> dict[str, Any]:
        return {"text": f"{run_id} waits at {gate}"}

    def decided(self, message: dict[str, Any], decided: dict[str, Any],
                headline: str) -> dict[str, Any]:
        return {**message, "text": headline, "decided": decided["decision"]}

    async def post(self, message: dict[str, Any]
                   ) -> tuple[dict[str, object], dict[str, object]]:
        self.posts.append(message)
        return {"status": 200}, {"channel": "C1", "ts": str(len(self.posts))}

    async def update(self, where: dict[str, Any], message: dict[str, Any]
                     ) -> tuple[dict[str, object], dict[str, object]]:
        return {"status": 200}, dict(where)


@contextlib.asynccontextmanager
async def _no_lock(run_id: str) -> AsyncIterator[None]:
    yield


async def _look(approvals: Any, run_id: str) -> None:
    """One look (`ChatApprovals.sync`), and the deliveries it started, to their end."""
    await approvals.sync(run_id)
    while approvals._tasks:
        await asyncio.gather(*list(approvals._tasks))


def _chat_approvals(store: Any, chat: Any) -> tuple[Any, Any]:
    """A server's deliveries to the chats (`ChatApprovals`) over ``store``, posting with
    ``chat`` (three attempts, no backoff), and the notifier whose ``record`` they use
    (the caller closes it)."""
    from interlock.server._chat import ChatApprovals
    from interlock.server._deliveries import Policy
    from interlock.server._hub import Hub
    from interlock.server._notify import Notifier

    hub = Hub()
    notes = Notifier([], "http://inbox", store, hub, _no_lock)
    approvals = ChatApprovals([chat], "http://inbox", store, hub, None,
                              notes.record, None,  # type: ignore[arg-type]
                              Policy(attempts=3, backoff=0.0))
    return approvals, notes


async def _sent(store: Any, run_id: str) -> list[dict[str, Any]]:
    return [r for r in await interlock.trace(run_id, store=store)
            if r["type"] == "notify.sent"]


@pytest.mark.parametrize("lost", ["refused", "answer_lost"])
def test_a_delivery_whose_record_fails(tmp_path: Path, lost: str,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    flow = tmp_path / "chatted.yaml"
    flow.write_text(GATED)
    # a refused record: the journal's retries (for RETRY_SECONDS) all fail, then it gives up
    monkeypatch.setattr("interlock._engine._journal.RETRY_SECONDS", 0.2)

    async def main() -> None:
        store = FaultyStore(interlock.open_store(f"sqlite:///{tmp_path / 'runs.db'}"))
        try:
            assert (await interlock.load(str(flow)).run({}, store=store, run_id="c1")
                    ).status == "WAITING_APPROVAL"
            chat = _Chat()
            approvals, notes = _chat_approvals(store, chat)
            before = await interlock.trace("c1", store=store)
            fault = store.fail_append(holding="notify.sent", after=lost == "answer_lost",
                                      times=None if lost == "refused" else 1)
            await _look(approvals, "c1")
            assert fault.hits >= 1 and len(chat.posts) == 1  # posted; its record failed
            store.heal()
            if lost == "refused":
                # nothing of it in the log, which is as it was
                assert await interlock.trace("c1", store=store) == before
                await _look(approvals, "c1")  # the next look: owed still, made again
                assert len(chat.posts) == 2
            else:
                await _look(approvals, "c1")  # the log says it was done: not again
                assert len(chat.posts) == 1
            [sent] = await _sent(store, "c1")
            assert (sent["via"], sent["action"], sent["attempt"], sent["status"]) == (
                "fake", "post", 1, 200)
            assert sent["where"] == {"channel": "C1", "ts": str(len(chat.posts))}
            await _look(approvals, "c1")  # and nothing more is owed
            assert len(chat.posts) == (2 if lost == "refused" else 1)
            assert len(await _sent(store, "c1")) == 1
            assert (await interlock.status("c1", store=store)).status == "WAITING_APPROVAL"
            assert (await interlock.verify("c1", store=store)).ok
            await notes.close()
        finally:
            await store.close()

    asyncio.run(main())
