"""``--notify URL``: a Slack-compatible message on every ``approval.requested``.

Each attempt is a ``notify.sent`` record in the run's log (``url``, ``attempt``,
``request``: the seq of the ``approval.requested`` it is about, and ``status`` or
``error``), so who was told, and when, is part of the audit trail. A failed attempt (no
answer, or not 2xx) is retried with exponential backoff.

Gates of runs this server executes are announced as they are requested; `watch` finds
the others (runs executed by the CLI or another process) among the waiting runs of the
store, and announces each gate whose log has no ``notify.sent`` for it yet.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any
from urllib.parse import quote

import httpx

from interlock import ClaimError, ConflictError, InterlockError, Store
from interlock.support import append_note, trace_pages

from ._hub import Hub

log = logging.getLogger("interlock.server")

NOTIFY_SENT = "notify.sent"
# how far back, beyond its previous pass, the watcher looks for changed runs: the
# writers' clocks (a run's updated_at is its writer's time) may be behind this server's
CLOCK_SKEW = 60.0


def payload(workflow: str, run_id: str, rec: dict[str, Any], public_url: str
            ) -> dict[str, Any]:
    """The message: ``text`` for any webhook, ``blocks`` for Slack."""
    node = rec.get("node")
    link = f"{public_url.rstrip('/')}/approvals?run_id={quote(run_id)}"
    show = rec.get("show") or {}
    text = (f"{workflow}: run {run_id} is waiting for a decision at {node} "
            f"({', '.join(rec.get('decisions') or [])}) -- {link}")
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text":
            f"*{workflow}*: run `{run_id}` is waiting for a decision at *{node}*"}}]
    if show:
        blocks.append({"type": "section", "fields": [
            {"type": "mrkdwn", "text": f"*{k}*\n`{_short(json.dumps(v, default=str))}`"}
            for k, v in list(show.items())[:10]]})
    blocks.append({"type": "actions", "elements": [
        {"type": "button", "text": {"type": "plain_text", "text": "Open the inbox"},
         "url": link}]})
    return {"text": text, "blocks": blocks}


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


class Notifier:
    def __init__(self, urls: list[str], public_url: str, store: Store, hub: Hub,
                 locks: Any, *, attempts: int = 5, backoff: float = 0.5,
                 timeout: float = 10.0) -> None:
        self.urls, self.public_url = urls, public_url
        self.store, self.hub, self.locks = store, hub, locks
        self.attempts, self.backoff, self.timeout = attempts, backoff, timeout
        self._tasks: set[asyncio.Task[None]] = set()
        self._client: httpx.AsyncClient | None = None
        self._announced: set[tuple[str, int]] = set()  # (run, approval.requested seq)
        self._looked_at: set[tuple[str, Any]] = set()  # (run, its gate's requested_at)
        self._since: float | None = None  # the runs changed after this, at the next pass
        self.looked = 0  # runs whose log `watch` read (for tests)

    async def watch(self, every: float) -> None:
        """Every ``every`` seconds, announce the gates of waiting runs that no
        ``notify.sent`` in their log is about (runs executed by other processes, or
        requested while no server was up)."""
        while self.urls:
            try:
                began = time.time()
                await self._scan()
                self._since = began - CLOCK_SKEW
            except InterlockError as exc:  # the store is away: try again next time
                log.warning("looking for approvals to announce: %s", exc)
            await asyncio.sleep(every)

    async def _scan(self) -> None:
        """One pass: the waiting runs whose row changed since the previous pass (light
        rows: no definition or input), and the log of each whose gate is new to us."""
        rows = await self.store.list_page(status="WAITING_APPROVAL", limit=10_000,
                                          updated_after=self._since)
        for row in rows:
            waiting = row.summary.waiting or {}
            requested = waiting.get("requested_at")
            if (row.run_id, requested) in self._looked_at:
                continue
            self.looked += 1
            gates: dict[int, dict[str, Any]] = {}
            told: set[int] = set()
            async for page in trace_pages(row.run_id, store=self.store):
                for rec in page:
                    if rec["type"] == "approval.requested":
                        gates[rec["seq"]] = rec
                    elif rec["type"] == "approval.decided":
                        gates = {s: g for s, g in gates.items()
                                 if (g["node"], g.get("visit")) !=
                                 (rec["node"], rec.get("visit"))}
                    elif rec["type"] == NOTIFY_SENT and rec.get("request") is not None:
                        told.add(rec["request"])
            self._looked_at.add((row.run_id, requested))  # read: not again
            for seq, rec in gates.items():
                if seq not in told:
                    self.requested(row.workflow, row.run_id, rec)

    def requested(self, workflow: str, run_id: str, rec: dict[str, Any]) -> None:
        """Called with each ``approval.requested`` (as it is staged)."""
        if not self.urls or (run_id, rec["seq"]) in self._announced:
            return
        self._announced.add((run_id, rec["seq"]))
        message = payload(workflow, run_id, rec, self.public_url)
        for url in self.urls:
            task = asyncio.get_running_loop().create_task(
                self._deliver(url, run_id, int(rec["seq"]), message))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _deliver(self, url: str, run_id: str, seq: int, message: dict[str, Any]
                       ) -> None:
        await self._committed(run_id, seq)
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout)
        for attempt in range(1, self.attempts + 1):
            outcome: dict[str, Any]
            try:
                response = await self._client.post(url, json=message)
                outcome, ok = {"status": response.status_code}, response.is_success
            except httpx.HTTPError as exc:
                outcome, ok = {"error": f"{type(exc).__name__}: {exc}"}, False
            await self._record(run_id, {"url": url, "attempt": attempt, "request": seq,
                                        **outcome})
            if ok:
                return
            if attempt < self.attempts:
                await asyncio.sleep(self.backoff * 2 ** (attempt - 1))
        log.warning("run %s: the notification to %s failed %d times; giving up", run_id,
                    url, self.attempts)

    async def _committed(self, run_id: str, seq: int) -> None:
        """Until the gate's record is stored (it was staged when we were called)."""
        for _ in range(100):
            waiter = self.hub.waiter(run_id)
            if (await self.store.get_run(run_id)).summary.last_seq >= seq:
                return
            await self.hub.wait(waiter, 0.1)

    async def _record(self, run_id: str, fields: dict[str, Any]) -> None:
        """``notify.sent`` under the run's claim; while the run's executor still holds
        it (it releases once the run waits), try again."""
        for _ in range(50):
            async with self.locks(run_id):
                try:
                    await append_note(run_id, NOTIFY_SENT, fields, store=self.store)
                    return
                except (ClaimError, ConflictError):
                    waiter = self.hub.waiter(run_id)
            await self.hub.wait(waiter, 0.2)
        log.warning("run %s: could not record %s %s (the run stayed claimed)", run_id,
                    NOTIFY_SENT, fields)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()
