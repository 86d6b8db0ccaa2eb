"""What the chats' deliveries (Slack, Google Chat) remember in a server: the runs whose
gates are owed a post or an update, not every run ever posted. Before, each gate's post
and update stayed in a set, and each run ever synced in a dict, for the server's life.
In process, with a chat that counts what it is asked to post (as
test_chat_delivery_faults does)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from test_chat_delivery_faults import GATED, _Chat, _chat_approvals, _look

import interlock

pytest.importorskip("httpx")


class _CountingChat(_Chat):
    def __init__(self) -> None:
        super().__init__()
        self.updates = 0

    async def update(self, where: dict[str, object], message: dict[str, object]
                     ) -> tuple[dict[str, object], dict[str, object]]:
        self.updates += 1
        return await super().update(where, message)  # type: ignore[arg-type]


def test_ended_runs_are_forgotten_and_not_posted_again(tmp_path: Path) -> None:
    flow = tmp_path / "chatted.yaml"
    flow.write_text(GATED)
    wf = interlock.load(str(flow))
    runs = 30

    async def main() -> None:
        store = interlock.open_store(f"sqlite:///{tmp_path / 'runs.db'}")
        try:
            chat = _CountingChat()
            approvals, notes = _chat_approvals(store, chat)
            for k in range(runs):
                run_id = f"c{k}"
                assert (await wf.run({}, store=store, run_id=run_id)).status == \
                    "WAITING_APPROVAL"
                await _look(approvals, run_id)  # posted
                done = await wf.resume(run_id, interlock.approve(by="ann"), store=store)
                assert done.status == "COMPLETED"
                await _look(approvals, run_id)  # the post updated with the decision
            assert (len(chat.posts), chat.updates) == (runs, runs)
            # nothing of the ended runs is kept...
            assert (len(approvals._done), len(approvals._synced),
                    len(approvals._locks)) == (0, 0, 0)
            # ...and looking again (the log says what was done) posts nothing more
            for k in range(runs):
                await _look(approvals, f"c{k}")
            assert (len(chat.posts), chat.updates) == (runs, runs)
            await notes.close()
        finally:
            await store.close()

    asyncio.run(main())


def test_a_waiting_run_is_posted_once_however_often_it_is_looked_at(tmp_path: Path) -> None:
    flow = tmp_path / "chatted.yaml"
    flow.write_text(GATED)

    async def main() -> None:
        store = interlock.open_store(f"sqlite:///{tmp_path / 'runs.db'}")
        try:
            assert (await interlock.load(str(flow)).run({}, store=store, run_id="w1")
                    ).status == "WAITING_APPROVAL"
            chat = _Chat()
            approvals, notes = _chat_approvals(store, chat)
            # looks that overlap the delivery, and looks after it
            await asyncio.gather(*(approvals.sync("w1") for _ in range(5)))
            await _look(approvals, "w1")
            await asyncio.gather(*(_look(approvals, "w1") for _ in range(5)))
            assert len(chat.posts) == 1
            assert len(approvals._synced) == 1  # a waiting run is remembered
            await notes.close()
        finally:
            await store.close()

    asyncio.run(main())
