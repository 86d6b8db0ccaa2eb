"""Approvals where people talk: each gate posted to the chats configured
(`Slack`, `GoogleChat`), the message updated once the gate is decided -- from a click,
the dashboard, the API or the CLI -- and clicks turned into decisions.

What happened is in the run's log, so it survives a restart and another server sees it:
each attempt of a post or an update, and each answer, is a ``notify.sent`` record
(``via``: the chat, ``action``: post / update / answer, ``request``: the seq of the
``approval.requested`` it is about, ``where``: the message's id in the chat, ``attempt``,
and ``status`` or ``error``, with ``retry_at`` or ``gave_up`` when it failed). `sync`
compares a run's gates with those records and works off what is owed (`_deliveries`:
retried with backoff, resumed by the next server after a restart); it runs when this
server sees a gate requested or decided, and `watch` runs it for the runs changed
elsewhere (the CLI's decisions, runs executed by another process) and, on start, for
every waiting run and those changed in the last hour (the deliveries a stopped server
left owed).

A click is decided by the mapped approver (``slack: U…`` / ``google_chat: users/…`` on an
``--auth`` entry) through `Server.decide_gate` with ``via`` the chat's name, for the
asking its message was posted for only (the button carries its ``approval.requested``'s
seq; the decision is pinned to that asking's ``requested_at``); a click on a gate decided
already or asked again since, by an unmapped user or one the gate's ``approvers:``
refuse records no decision and is answered (ephemerally) with why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, Protocol

from interlock import Decision, InterlockError, RunNotFound, Store, UsageError
from interlock.support import TERMINAL_TYPES, trace_pages

from ._auth import DECIDE, Tokens
from ._deliveries import Ledger, Policy, deliver
from ._guard import Problemed
from ._hub import Hub
from ._notify import CLOCK_SKEW, NOTIFY_SENT, decided_headline

log = logging.getLogger("interlock.server")

Record = Callable[[str, dict[str, object]], Awaitable[None]]
Decide = Callable[[str, str, Decision, str], Awaitable[None]]
Send = Callable[[], Awaitable[tuple[dict[str, object], dict[str, object]]]]
ACTIONS = ("post", "update")  # a delivery's actions (an answer is no delivery: not retried)
_ENDED = frozenset(TERMINAL_TYPES.values())  # a run's statuses once it has ended


class Chat(Protocol):
    name: str

    def message(self, workflow: str, run_id: str, gate: str, rec: dict[str, Any],
                public_url: str) -> dict[str, Any]: ...

    def decided(self, message: dict[str, Any], decided: dict[str, Any], headline: str
                ) -> dict[str, Any]: ...

    async def post(self, message: dict[str, Any]
                   ) -> tuple[dict[str, object], dict[str, object]]: ...

    async def update(self, where: dict[str, Any], message: dict[str, Any]
                     ) -> tuple[dict[str, object], dict[str, object]]: ...



def gate_name(rec: dict[str, Any]) -> str:
    """A gate as waiting.pending and the API's ``node`` name it."""
    if rec.get("path"):
        return str(rec["path"])
    node = str(rec["node"])
    return node if rec.get("item") is None else f"{node}[{rec['item']}]"


def _key(rec: dict[str, Any]) -> tuple[object, object, object]:
    return rec["node"], rec.get("visit"), rec.get("item")


class ChatApprovals:
    def __init__(self, chats: list[Chat], public_url: str, store: Store, hub: Hub,
                 tokens: Tokens | None, record: Record, decide: Decide,
                 policy: Policy | None = None) -> None:
        self.chats, self.public_url = chats, public_url
        self.policy = policy or Policy()
        self.store, self.hub, self.tokens = store, hub, tokens
        self.record, self.decide = record, decide
        self._done: set[tuple[str, str, int, str]] = set()  # (chat, run, request, action)
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}  # one sync a run
        self._tasks: set[asyncio.Task[None]] = set()
        self._since: float | None = None
        self._synced: dict[str, int] = {}  # run: its last seq when `sync` last read it

    def _spawn(self, coro: Coroutine[object, object, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def changed(self, run_id: str, seq: int | None = None) -> None:
        """A gate of ``run_id`` was requested or decided (its record ``seq`` staged):
        post or update, once it is stored."""
        if self.chats:
            self._spawn(self._after(run_id, seq))

    async def _after(self, run_id: str, seq: int | None) -> None:
        if seq is not None:
            for _ in range(100):
                waiter = self.hub.waiter(run_id)
                if (await self.store.get_run(run_id)).summary.last_seq >= seq:
                    break
                await self.hub.wait(waiter, 0.1)
        try:
            await self.sync(run_id)
        except InterlockError as exc:
            log.warning("run %s: chat messages not brought up to date: %s", run_id, exc)

    async def watch(self, every: float) -> None:
        """Every ``every`` seconds, `sync` the runs changed since the previous pass whose
        log grew since `sync` read it. The first pass: every waiting run, however long it
        has waited (a gate requested while no server was up), and the runs changed in
        the last hour (the updates a stopped server left owed)."""
        while self.chats:
            try:
                began = time.time()
                rows = await self.store.list_page(limit=10_000, updated_after=(
                    self._since if self._since is not None else began - 3600))
                if self._since is None:
                    rows += await self.store.list_page(status="WAITING_APPROVAL",
                                                       limit=10_000)
                for row in rows:
                    if self._synced.get(row.run_id) != row.summary.last_seq:
                        await self.sync(row.run_id)
                self._since = began - CLOCK_SKEW
            except InterlockError as exc:
                log.warning("looking for gates to post to chats: %s", exc)
            await asyncio.sleep(every)

    async def sync(self, run_id: str) -> None:
        """Post each undecided gate not posted yet; update each decided gate's message."""
        async with self._lock(run_id):
            await self._sync(run_id)

    @contextlib.asynccontextmanager
    async def _lock(self, run_id: str) -> AsyncIterator[None]:
        """The run's sync lock (its entry dropped with its last user)."""
        lock, users = self._locks.setdefault(run_id, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if not users[0]:
                del self._locks[run_id]

    async def _sync(self, run_id: str) -> None:
        row = await self.store.get_run(run_id)
        # (an ended run is forgotten: `watch` lists it again only if its log grows)
        if row.summary.status in _ENDED:
            self._synced.pop(run_id, None)
        else:
            self._synced[run_id] = row.summary.last_seq
        requested: dict[int, dict[str, Any]] = {}
        latest: dict[tuple[object, object, object], int] = {}  # a gate: its last asking
        decided: dict[int, dict[str, Any]] = {}  # an asking: the decision that answered it
        books: dict[tuple[str, int, str], Ledger] = {}  # (chat, request, action): attempts
        async for page in trace_pages(run_id, store=self.store):
            for rec in page:
                if rec["type"] == "approval.requested":
                    requested[rec["seq"]] = rec
                    latest[_key(rec)] = rec["seq"]  # (asked again: a later visit, ...)
                elif rec["type"] == "approval.decided" and _key(rec) in latest:
                    decided.setdefault(latest[_key(rec)], rec)
                elif rec["type"] == NOTIFY_SENT and rec.get("via") and \
                        rec.get("request") is not None and rec.get("action") in ACTIONS:
                    books.setdefault((rec["via"], rec["request"], rec["action"]),
                                     Ledger()).add(rec)
        open_ = row.summary.status == "WAITING_APPROVAL"
        for seq, rec in requested.items():
            done = decided.get(seq)
            for chat in self.chats:
                post = books.get((chat.name, seq, "post"), Ledger())
                update = books.get((chat.name, seq, "update"), Ledger())
                if done is None and open_ and not post.over:
                    self._start(chat, row.workflow, run_id, rec, post, None)
                elif done is not None and post.delivered and not update.over:
                    self._start(chat, row.workflow, run_id, rec, update, (post.where, done))

    def _start(self, chat: Chat, workflow: str, run_id: str, rec: dict[str, Any],
               books: Ledger, decided: tuple[dict[str, Any], dict[str, Any]] | None) -> None:
        """Work off one delivery owed (`_deliveries.deliver`), unless this server already
        is: the gate's post (``decided`` None), or its update (where the post is, and
        the decision)."""
        action = "post" if decided is None else "update"
        key = (chat.name, run_id, rec["seq"], action)
        if key in self._done:
            return
        self._done.add(key)
        gate = gate_name(rec)
        message = chat.message(workflow, run_id, gate, rec, self.public_url)
        fields: dict[str, object] = {"via": chat.name, "action": action,
                                     "request": rec["seq"], "gate": gate}
        if decided is None:
            def send() -> Awaitable[tuple[dict[str, object], dict[str, object]]]:
                return chat.post(message)
        else:
            where, done = decided
            fields["where"] = where

            def send() -> Awaitable[tuple[dict[str, object], dict[str, object]]]:
                return chat.update(where, chat.decided(
                    message, done, decided_headline(workflow, run_id, gate, done)))

        async def record(outcome: dict[str, object]) -> None:
            await self._record(run_id, {**fields, **outcome})

        async def still_owed() -> bool:
            return decided is not None or await self._waits(run_id, rec)

        what = f"run {run_id}: the {chat.name} {action} of gate {gate}"
        if books.attempts:
            log.info("%s: resumed after %d failed attempt(s)", what, books.attempts)
        self._spawn(self._deliver(key, what, send, record, still_owed, books))

    async def _deliver(self, key: tuple[str, str, int, str], what: str, send: Send,
                       record: Callable[[dict[str, object]], Awaitable[None]],
                       still_owed: Callable[[], Awaitable[bool]], books: Ledger) -> None:
        try:
            await deliver(what, send, record, still_owed, self.policy, books)
        except InterlockError as exc:  # the store is away: the next `sync` looks again
            self._done.discard(key)
            log.warning("%s: not done (%s); tried again at the next look", what, exc)
            return
        # its attempts are in the log now, which a `sync` reads (under the run's lock)
        # before it starts a delivery: the key is needed no more (kept, one per gate of
        # every run ever posted, it grew with the runs for the server's life)
        async with self._lock(key[1]):
            self._done.discard(key)

    async def _waits(self, run_id: str, rec: dict[str, Any]) -> bool:
        """Whether the gate ``rec`` asked is still waiting (its post still owed)."""
        if (await self.store.get_run(run_id)).summary.status != "WAITING_APPROVAL":
            return False
        async for page in trace_pages(run_id, store=self.store, after=rec["seq"]):
            if any(r["type"] == "approval.decided" and _key(r) == _key(rec) for r in page):
                return False
        return True

    async def _record(self, run_id: str, fields: dict[str, object]) -> None:
        await self.record(run_id, fields)  # (after the run's final record too)

    # -- clicks --------------------------------------------------------------------------

    async def clicked(self, chat: Chat, user: str, run_id: str, gate: str,
                      decision: str, request: int | None = None) -> str | None:
        """Decide ``gate`` as the approver ``user`` maps to -- only the asking the message
        was posted for (``request``: its ``approval.requested``'s seq), refused once the
        gate was asked again; or why not (nothing recorded: the caller answers the user
        with it, see `answered`)."""
        who = self.tokens.chat_user(chat.name, user) if self.tokens is not None else None
        if decision not in ("approve", "reject"):
            return f"{decision!r} is not a decision a chat may make (approve, reject)"
        if who is None:
            key = "slack" if chat.name == "slack" else "google_chat"
            return (f"your {chat.name} user {user} is not mapped to an approver: the "
                    f"server's --auth file needs '{key}: {user}' on your entry")
        if not who.may(DECIDE):
            return (f"{who.name} may not decide gates (roles: {', '.join(who.roles)}; "
                    "approver or admin needed)")
        try:
            asked = await self._asked(run_id, gate, request)
            if isinstance(asked, str):
                return asked
            await self.decide(run_id, gate, Decision(
                decision, who.name, node=gate, roles=who.roles,  # type: ignore[arg-type]
                requested_at=asked), chat.name)
        except Problemed as exc:
            return exc.detail
        except (UsageError, RunNotFound) as exc:
            return str(exc)
        self.changed(run_id)
        return None

    async def _asked(self, run_id: str, gate: str, request: int | None) -> float | str | None:
        """When the asking a click is for was asked (the decision's ``requested_at``, which
        the engine checks against the gate waiting), or why the click decides nothing.

        A button of an older version carries no ``request``: it is taken for whichever
        asking waits -- except an unknown outcome's, which it can only be an earlier
        message's button for (approving would run the action again unseen)."""
        if request is None:
            waiting = (await self.store.get_run(run_id)).summary.waiting or {}
            if any(g.get("node") == gate and g.get("kind") == "unknown_outcome"
                   for g in waiting.get("pending") or [waiting]):
                return (f"this button is on an earlier message of gate {gate!r} (of run "
                        f"{run_id}), posted before its outcome was unknown; the gate now "
                        "asks whether to run the action AGAIN: decide that on its newer "
                        "message, or in the dashboard's inbox")
            return None
        async for page in trace_pages(run_id, store=self.store, page=1,
                                      after=max(request - 1, 0)):
            rec = page[0] if page else None
            if rec is not None and rec["seq"] == request and \
                    rec["type"] == "approval.requested" and gate_name(rec) == gate:
                return float(rec["at"])
            break
        return (f"this button is for no request of gate {gate!r} of run {run_id} (record "
                f"{request} of the run is not its asking)")

    def answered(self, chat: Chat, run_id: str, gate: str, user: str,
                 outcome: Coroutine[object, object, dict[str, object]] | dict[str, object]) -> None:
        """Record the answer to a refused click (sent by ``outcome``, or sent already)."""
        log.info("run %s: a %s click on %s by %s refused", run_id, chat.name, gate, user)
        self._spawn(self._answered(chat, run_id, gate, user, outcome))

    async def _answered(self, chat: Chat, run_id: str, gate: str, user: str,
                        outcome: Coroutine[object, object, dict[str, object]] | dict[str, object]
                        ) -> None:
        fields = outcome if isinstance(outcome, dict) else await outcome
        with contextlib.suppress(RunNotFound):
            await self._record(run_id, {"via": chat.name, "action": "answer", "gate": gate,
                                        "user": user, **fields})

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
