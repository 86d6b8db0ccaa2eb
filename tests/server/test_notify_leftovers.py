"""What ``--notify`` remembers in a server: the gates whose webhook deliveries are under
way, not every gate ever announced. Before, each announced gate stayed in a set (and
each waiting run's log read in another) for the server's life. Against a local fake
webhook on loopback (test_notify_retry_after's), in process."""

from __future__ import annotations

import asyncio
import http.server
import threading
from pathlib import Path
from typing import Any

import pytest
from test_notify_retry_after import GATED, _Hook, _no_lock

import interlock

pytest.importorskip("httpx")


def test_announced_gates_are_forgotten_once_delivered_and_not_announced_again(
        tmp_path: Path) -> None:
    from interlock.server._hub import Hub
    from interlock.server._notify import Notifier

    _Hook.answers, _Hook.posts = [], 0
    hook = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    flow = tmp_path / "hooked.yaml"
    flow.write_text(GATED)
    wf = interlock.load(str(flow))
    runs = 8

    async def settled(notifier: Any) -> None:
        while notifier._tasks:
            await asyncio.gather(*list(notifier._tasks))

    async def main() -> None:
        store = interlock.open_store(f"sqlite:///{tmp_path / 'runs.db'}")
        url = f"http://127.0.0.1:{hook.server_address[1]}/hook"
        notifier = Notifier([url, url], "http://inbox", store, Hub(), _no_lock)
        try:
            for k in range(runs):
                assert (await wf.run({}, store=store, run_id=f"h{k}")).status == \
                    "WAITING_APPROVAL"
                # the executor's announcement and a scan's, overlapping: one delivery
                rec = next(r for r in await interlock.trace(f"h{k}", store=store)
                           if r["type"] == "approval.requested")
                notifier.requested("hooked", f"h{k}", rec)
                await notifier._scan()
                await settled(notifier)
            assert _Hook.posts == 2 * runs  # each gate once to each of the two URLs
            assert notifier._announced == {}  # nothing under way is remembered
            # every run still waits: a scan from scratch (a restarted server's) reads
            # each log, finds each gate told, and announces nothing again
            notifier._since = None
            notifier._looked_at.clear()
            await notifier._scan()
            await settled(notifier)
            assert _Hook.posts == 2 * runs
            assert notifier.looked == 2 * runs
        finally:
            await notifier.close()
            await store.close()
            hook.shutdown()
            hook.server_close()

    asyncio.run(main())


def test_the_logs_a_scan_remembers_reading_are_bounded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from interlock.server._hub import Hub
    from interlock.server._notify import Notifier

    monkeypatch.setattr("interlock.server._notify.LOOKED_KEPT", 5)
    flow = tmp_path / "hooked.yaml"
    flow.write_text(GATED)
    wf = interlock.load(str(flow))

    async def main() -> None:
        store = interlock.open_store(f"sqlite:///{tmp_path / 'runs.db'}")
        # a webhook that is never reached: the deliveries are cut short at once
        notifier = Notifier(["http://127.0.0.1:9/hook"], "http://inbox", store, Hub(),
                            _no_lock, attempts=1, timeout=0.5)
        try:
            for k in range(12):
                assert (await wf.run({}, store=store, run_id=f"b{k}")).status == \
                    "WAITING_APPROVAL"
            await notifier._scan()
            while notifier._tasks:
                await asyncio.gather(*list(notifier._tasks))
            assert notifier.looked == 12
            assert len(notifier._looked_at) == 5
        finally:
            await notifier.close()
            await store.close()

    asyncio.run(main())
