"""``--notify URL``: a Slack-compatible message on every ``approval.requested``.

Each attempt is a ``notify.sent`` record in the run's log (``url``: the webhook's scheme
and host only, ``notify``: which ``--notify`` it is, from 1, ``attempt``, ``request``: the
seq of the ``approval.requested`` it is about, and ``status`` or ``error``), so who was
told, and when, is part of the audit trail -- and the webhook's path, query and
credentials (for Slack, the URL *is* the credential) are never in it. A failed attempt
(no answer, or not 2xx) is retried with exponential backoff -- or, when the webhook
answered 429 or 503 with a ``Retry-After`` (seconds, or an HTTP date), after that delay,
cut to `LONGEST_WAIT` (the attempt's record says ``retry_after``).

An attempt is bounded: `ATTEMPT_SECONDS` in all (connecting, sending, the answer's
head), and the answer's body is never read. A run that has ended gets no more
attempts; an attempt that ends after the run did is recorded all the same, after the
run's final record (``notify.sent`` is the one record that may follow it).

Everything taken from the run in the message is escaped for Slack's mrkdwn (``&``,
``<``, ``>``; backquotes in code spans), so node output cannot add links or mentions.

Gates of runs this server executes are announced as they are requested; `watch` finds
the others (runs executed by the CLI or another process) among the waiting runs of the
store, and announces each gate whose log has no ``notify.sent`` for it yet.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Coroutine
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from interlock import ClaimError, ConflictError, InterlockError, Store
from interlock.support import TERMINAL_TYPES, append_note, gate_text, trace_pages

from ._deliveries import LONGEST_WAIT, retry_after
from ._hub import Hub

log = logging.getLogger("interlock.server")

NOTIFY_SENT = "notify.sent"
ATTEMPT_SECONDS = 10.0  # one attempt, whole: connect, send, the answer's status
_ENDED = frozenset(TERMINAL_TYPES.values())
LOOKED_KEPT = 10_000  # waiting runs whose log a scan remembers having read
_SAYS_WHEN = frozenset({429, 503})  # the answers whose Retry-After says when to try again


def shown(url: str) -> str:
    """What may be recorded and logged of a webhook URL: its scheme and host (and port);
    never its user, password, path or query, any of which may be its secret."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(an invalid URL)"
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme or '?'}://{host}{port}"


def mrkdwn(text: str) -> str:
    """``text`` as Slack mrkdwn shows it literally: no link, mention or entity."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _code(text: str) -> str:
    """``text`` inside a code span (where Slack links nothing): a backquote in it would
    end the span, so it is shown as a modifier grave."""
    return "`" + mrkdwn(text).replace("`", "\u02cb") + "`"


# how far back, beyond its previous pass, the watcher looks for changed runs: the
# writers' clocks (a run's updated_at is its writer's time) may be behind this server's
CLOCK_SKEW = 60.0


def payload(workflow: str, run_id: str, rec: dict[str, Any], public_url: str
            ) -> dict[str, Any]:
    """The message: ``text`` for any webhook, ``blocks`` for Slack. An ``unknown_outcome``
    gate (an approved action whose process died while it ran) is explained in both:
    approving runs it AGAIN (`interlock.support.gate_text`'s words)."""
    node = rec.get("path") or (rec.get("node") if rec.get("item") is None
                               else f"{rec.get('node')}[{rec.get('item')}]")
    link = f"{public_url.rstrip('/')}/approvals?run_id={quote(run_id)}"
    show = gate_text.shown(rec)
    unknown = outcome_lines(rec)
    text = (f"{mrkdwn(workflow)}: run {mrkdwn(run_id)} is waiting for a decision at "
            f"{mrkdwn(str(node))} ({mrkdwn(', '.join(rec.get('decisions') or []))})")
    text += "".join(f"\n{mrkdwn(line)}" for line in unknown) + f" -- <{link}>"
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text":
            f"*{mrkdwn(workflow)}*: run {_code(run_id)} is waiting for a decision at "
            f"*{mrkdwn(str(node))}*"}}]
    if unknown:
        head, *rest = (mrkdwn(line) for line in unknown)
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": _short(
            f":warning: *{head.replace(': ', ':* ', 1)}\n" + "\n".join(
                f"• {line}" for line in rest), 2900)}})
    if show:
        blocks.append({"type": "section", "fields": [
            {"type": "mrkdwn", "text": f"*{mrkdwn(str(k))}*\n"
                                       f"{_code(_short(json.dumps(v, default=str)))}"}
            for k, v in list(show.items())[:10]]})
    blocks.append({"type": "actions", "elements": [
        {"type": "button", "text": {"type": "plain_text", "text": "Open the inbox"},
         "url": link}]})
    return {"text": text, "blocks": blocks}


def decided_text(rec: dict[str, Any], verb_first: bool = True) -> str:
    """Who decided an asking, how and when: "Approved by alice (via slack) at ..."."""
    decision = str(rec.get("decision"))
    verb = {"approved": "Approved", "rejected": "Rejected", "modified": "Modified",
            "closed": "Closed"}.get(decision, decision)
    by = f" by {rec['by']}" if rec.get("by") else ""
    via = f" (via {rec['via']})" if rec.get("via") else ""
    when = rec.get("ts") or rec.get("at")
    if isinstance(when, int | float):
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(when))
    at = f" at {when}" if when else ""
    return f"{verb if verb_first else verb.lower()}{by}{via}{at}"


def decided_headline(workflow: str, run_id: str, gate: str, decided: dict[str, Any]) -> str:
    """A gate message's first line once the gate is decided (it said "is waiting")."""
    return f"{workflow}: run {run_id}: {gate} {decided_text(decided, verb_first=False)}"


def outcome_lines(rec: dict[str, Any]) -> list[str]:
    """An ``unknown_outcome`` gate explained for a chat or a webhook, where a button
    cannot carry data: the outcome checked by hand is recorded from the inbox (none for
    another gate)."""
    if not gate_text.is_unknown(rec):
        return []
    example = gate_text.data_example(rec)
    return gate_text.unknown_lines(rec, data=f"approve in the inbox with data {example}")


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


class Notifier:
    def __init__(self, urls: list[str], public_url: str, store: Store, hub: Hub,
                 locks: Any, *, attempts: int = 5, backoff: float = 0.5,
                 timeout: float = ATTEMPT_SECONDS) -> None:
        self.urls, self.public_url = urls, public_url
        self.store, self.hub, self.locks = store, hub, locks
        self.attempts, self.backoff, self.timeout = attempts, backoff, timeout
        self._tasks: set[asyncio.Task[None]] = set()
        self._client: httpx.AsyncClient | None = None
        # (run, approval.requested seq): how many of its deliveries are under way. The
        # entry goes with the last, its attempts recorded: a scan reads them in the log
        # from then on (kept for good, the entries grew by one per gate ever announced)
        self._announced: dict[tuple[str, int], int] = {}
        self._reading = asyncio.Lock()  # a scan's look at a run's log, or an entry's end
        # (run, its gate's requested_at): the waiting runs whose log was read, the
        # LOOKED_KEPT last (one forgotten is read again if its row changes: nothing in it
        # is announced twice, its log says what was)
        self._looked_at: OrderedDict[tuple[str, object], None] = OrderedDict()
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
            async with self._reading:
                await self._look(row.workflow, row.run_id, requested)

    async def _look(self, workflow: str, run_id: str, requested: object) -> None:
        """Announce the gates of the run's log that no ``notify.sent`` is about."""
        self.looked += 1
        gates: dict[int, dict[str, Any]] = {}
        told: set[int] = set()
        async for page in trace_pages(run_id, store=self.store):
            for rec in page:
                if rec["type"] == "approval.requested":
                    gates[rec["seq"]] = rec
                elif rec["type"] == "approval.decided":
                    gates = {s: g for s, g in gates.items()  # (one gate: an item's,
                             if (g["node"], g.get("visit"), g.get("item")) !=  # too)
                             (rec["node"], rec.get("visit"), rec.get("item"))}
                elif rec["type"] == NOTIFY_SENT and rec.get("request") is not None \
                        and not rec.get("via"):  # (a chat's post is not a --notify)
                    told.add(rec["request"])
        self._looked_at[(run_id, requested)] = None  # read: not again
        while len(self._looked_at) > LOOKED_KEPT:
            self._looked_at.popitem(last=False)
        for seq, rec in gates.items():
            if seq not in told:
                self.requested(workflow, run_id, rec)

    def requested(self, workflow: str, run_id: str, rec: dict[str, Any]) -> None:
        """Called with each ``approval.requested`` (as it is staged)."""
        key = (run_id, int(rec["seq"]))
        if not self.urls or key in self._announced:
            return
        self._announced[key] = len(self.urls)
        message = payload(workflow, run_id, rec, self.public_url)
        for index, url in enumerate(self.urls, 1):
            task = asyncio.get_running_loop().create_task(
                self._delivered(key, self._deliver(index, url, run_id, key[1], message)))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _delivered(self, key: tuple[str, int],
                         delivery: Coroutine[object, object, None]) -> None:
        """``delivery``, then the gate's entry gone with its last delivery."""
        try:
            await delivery
        finally:
            self._announced[key] -= 1
            if not self._announced[key]:
                async with self._reading:  # (not while a scan reads the log: it may
                    del self._announced[key]  # have read it before the records)

    async def _deliver(self, index: int, url: str, run_id: str, seq: int,
                       message: dict[str, Any]) -> None:
        await self._committed(run_id, seq)
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout)
        where = f"--notify {index} ({shown(url)})"
        for attempt in range(1, self.attempts + 1):
            if await self._ended(run_id):
                log.info("run %s has ended: no more notifications to %s", run_id, where)
                return
            outcome, ok = await self._post(url, message)
            await self._record(run_id, {"url": shown(url), "notify": index,
                                        "attempt": attempt, "request": seq, **outcome})
            if ok:
                return
            if attempt < self.attempts:
                later = outcome.get("retry_after")
                await self.pause(min(float(later), LONGEST_WAIT)
                                 if isinstance(later, int | float)
                                 else self.backoff * 2 ** (attempt - 1))
        log.warning("run %s: the notification to %s failed %d times; giving up", run_id,
                    where, self.attempts)

    async def _post(self, url: str, message: dict[str, Any]) -> tuple[dict[str, object], bool]:
        """One attempt, bounded in time (`timeout` in all) and in what is read (the
        answer's status; its body is dropped unread). The error never holds the URL."""
        assert self._client is not None
        try:
            async with asyncio.timeout(self.timeout):
                async with self._client.stream("POST", url, json=message) as response:
                    outcome: dict[str, object] = {"status": response.status_code}
                    wait = retry_after(response.headers.get("retry-after")) \
                        if response.status_code in _SAYS_WHEN else None
                    if wait is not None:
                        outcome["retry_after"] = round(wait, 3)
                    return outcome, response.is_success
        except TimeoutError:
            return {"error": f"no answer within {self.timeout:g}s"}, False
        except httpx.HTTPError as exc:
            text = str(exc).replace(url, shown(url))
            return {"error": f"{type(exc).__name__}: {text}"}, False

    async def pause(self, seconds: float) -> None:
        """The wait between two attempts (a test's to watch)."""
        await asyncio.sleep(seconds)

    async def _ended(self, run_id: str) -> bool:
        return (await self.store.get_run(run_id)).summary.status in _ENDED

    async def _committed(self, run_id: str, seq: int) -> None:
        """Until the gate's record is stored (it was staged when we were called)."""
        for _ in range(100):
            waiter = self.hub.waiter(run_id)
            if (await self.store.get_run(run_id)).summary.last_seq >= seq:
                return
            await self.hub.wait(waiter, 0.1)

    async def record(self, run_id: str, fields: dict[str, object]) -> None:
        await self._record(run_id, fields)

    async def _record(self, run_id: str, fields: dict[str, object]) -> None:
        """``notify.sent`` under the run's claim (after the run's final record too);
        while the run's executor still holds it (it releases once the run waits or
        ends), try again."""
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
