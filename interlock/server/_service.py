"""The server as a service: the store, the hub, the pool and run loops, the polls, the
notifier and the triggers' firer that the endpoints share, and their lifecycle."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio

import interlock
from interlock.support import (
    TOKEN_SINK,
    Firer,
    GateNotWaiting,
    GateTaken,
    Metrics,
    NoKey,
    NoSuchGate,
    NotAnApprover,
    NotFired,
    RunView,
    decide_gate,
    key_refusal,
    load_workflows,
    resume_keys_missing,
    unkeyed,
)

from ._auth import LOCAL, Identity, Tokens
from ._chat import Chat, ChatApprovals
from ._deliveries import Policy
from ._google_chat import GoogleChat
from ._guard import Problemed
from ._hub import Hub, NotifyingStore
from ._loops import RunLoops
from ._notify import Notifier
from ._pool import Pool
from ._reads import Approvals, Polls
from ._slack import Slack

log = logging.getLogger("interlock.server")

# how to have a run of an agent whose key this server lacks executed (`refuse_unkeyed`)
KEY_FIX = ("set the variable in the environment of `interlock serve` and restart it, or "
           "serve with --workers 0 and have `interlock worker` processes whose environment "
           "has the key execute the runs")


@dataclass
class ServerOptions:
    """What ``interlock serve`` takes (see `create_app`)."""

    store: str | None = None  # a URL; None: $INTERLOCK_STORE, then ./.interlock/runs.db
    workflows: Sequence[str] = ()  # files, or folders of *.yaml / *.yml / *.json
    auth: str | None = None  # the --auth YAML file
    notify: Sequence[str] = ()  # webhook URLs told of every approval.requested
    public_url: str = "http://127.0.0.1:8765"  # where the inbox link points
    workers: int = 4  # executions at a time; 0: record only, `interlock worker` executes
    poll: float = 0.25  # seconds between reads of a followed run written elsewhere
    keepalive: float = 15.0  # seconds between SSE keepalive comments
    drain: float = 10.0  # seconds a stopping server waits for its executions
    notify_attempts: int = 5
    notify_backoff: float = 0.5
    notify_timeout: float = 10.0  # seconds for one attempt, whole
    notify_scan: float = 2.0  # seconds between looks for gates requested elsewhere
    take_over: bool = True  # continue runs whose process is gone, on start
    host: str = "127.0.0.1"  # the bound address: a Host the server answers to
    # more Host names answered (a reverse proxy's); with `auth`, Host is checked only
    # when some are given (a bearer token is no ambient credential for a page to reuse)
    allowed_hosts: Sequence[str] = ()
    # gates posted to Slack (SLACK_BOT_TOKEN, SLACK_SIGNING_SECRET from the
    # environment) and Google Chat (GOOGLE_CHAT_CREDENTIALS), clicks decided
    slack_channel: str | None = None
    google_chat_space: str | None = None
    google_chat_audience: str | None = None
    google_chat_keys: str | None = None  # a JWKS file; None: Google's published keys
    chat_attempts: int = 6  # a chat's post or update: attempts in all (`_deliveries`)
    chat_backoff: float = 1.0  # seconds before its second attempt, doubled for each next



class Server:
    """What the endpoints share: the store, the workflows, the pool, the notifier."""

    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        self.workflows = load_workflows(options.workflows)
        self.tokens = Tokens.load(options.auth) if options.auth else None
        self.hub = Hub()
        self.store: NotifyingStore | None = None
        self.pool: Pool | None = None
        self.notifier: Notifier | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._firing: asyncio.Task[None] | None = None  # the triggers' firer
        self.metrics = Metrics()  # the runs it executes observed; the store's read per scrape
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}
        self.loops: RunLoops | None = None  # where runs execute (None: on the API's loop)
        self._api: asyncio.AbstractEventLoop | None = None  # the API's loop
        self.approvals = Approvals()  # the inbox, kept per run at its last seq
        # what else runs from start to stop (/mcp's session manager): entered last in
        # `start`, left first in `stop`, in the task that starts and stops the service
        self.alongside: list[Callable[[], contextlib.AbstractAsyncContextManager[Any]]] = []
        self._alongside = contextlib.AsyncExitStack()
        self.polls: Polls | None = None  # one poll per followed run (`follow`)
        self.slack = Slack.from_env(options.slack_channel)
        self.google_chat = GoogleChat.from_options(
            options.google_chat_space, options.google_chat_audience, options.google_chat_keys)
        self.chat: ChatApprovals | None = None
        self._chat_watcher: asyncio.Task[None] | None = None

    @property
    def chats(self) -> list[Chat]:
        return [c for c in (self.slack, self.google_chat) if c is not None]

    @contextlib.asynccontextmanager
    async def lock(self, run_id: str) -> AsyncIterator[None]:
        """One change of a run's log at a time from this server (a decision, a note)."""
        lock, users = self._locks.setdefault(run_id, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if not users[0]:
                del self._locks[run_id]

    @property
    def st(self) -> NotifyingStore:
        assert self.store is not None, "the server has not started"
        return self.store

    @property
    def records_only(self) -> bool:
        """``--workers 0``: starts, decisions and resumes are recorded (the run PENDING)
        for workers to execute."""
        return self.options.workers == 0

    @property
    def runs(self) -> Pool:
        assert self.pool is not None, "the server has not started"
        return self.pool

    async def start(self) -> None:
        self._api = asyncio.get_running_loop()
        # FastAPI runs sync dependencies on anyio's threads, whose backend module is
        # imported on first use: done here, so a first request under descriptor
        # exhaustion (idle connections up to the limit) needs no file opened to import
        await anyio.to_thread.run_sync(lambda: None)
        self.store = NotifyingStore(interlock.open_store(self.options.store), self.hub)
        if not self.records_only and not self.store.url.startswith("memory:"):
            # node bodies off the API's loop (a memory store is this loop's alone); a
            # SQLite store serves every loop, a PostgreSQL one is opened per loop
            shared = self.store.inner if self.store.url.startswith("sqlite:") else None
            self.loops = RunLoops(self.store.url, self.hub, shared=shared,
                                  stop_wait=max(self.options.drain, 1.0))
        self.pool = Pool(self.store, self.hub, self.options.workers, self.loops)
        self.polls = Polls(lambda: self.st, self.hub, self.options.poll,
                           self.runs.executing)
        self.notifier = Notifier(list(self.options.notify), self.options.public_url,
                                 self.store, self.hub, self.lock,
                                 attempts=self.options.notify_attempts,
                                 backoff=self.options.notify_backoff,
                                 timeout=self.options.notify_timeout)
        self.chat = ChatApprovals(self.chats, self.options.public_url, self.store, self.hub,
                                  self.tokens, self.notifier.record, self.decide_gate,
                                  Policy(self.options.chat_attempts, self.options.chat_backoff))
        if self.options.take_over and self.records_only:
            log.info("--workers 0: this server executes no run; `interlock worker` "
                     "processes on its store do")
        elif self.options.take_over:
            await self.pool.take_over(self.store, self.resumer)
        if self.options.notify:
            self._watcher = asyncio.get_running_loop().create_task(
                self.notifier.watch(self.options.notify_scan))
        if self.chats:
            self._chat_watcher = asyncio.get_running_loop().create_task(
                self.chat.watch(self.options.notify_scan))
        timed = {name: wf.spec for name, wf in self.workflows.items() if wf.spec.triggers}
        if timed:  # the registered workflows' triggers: fired here (see `fire`)
            self._firing = asyncio.get_running_loop().create_task(
                Firer(timed, self.fire, self.st.inner).run(self.hub.stopping))
        for running in self.alongside:
            await self._alongside.enter_async_context(running())

    async def begin(self, workflow: str, data: dict[str, Any], run_id: str | None = None,
                    config: dict[str, Any] | None = None) -> interlock.RunResult:
        """Start a run of a registered workflow, as an API start or a trigger does:
        executed here (in the pool), or recorded PENDING with ``--workers 0``; the run
        as it stands now. `RunExists` when a run has that id; `NoKey` (nothing
        recorded) when this server would execute it and an agent lacks its key."""
        wf = self.workflows[workflow]
        self.refuse_unkeyed(workflow)
        if self.records_only:
            pending = await wf.submit(data, store=self.st, run_id=run_id, config=config)
            self.hub.changed(pending.run_id)
            return pending
        started = await wf.start(data, store=self.st, run_id=run_id, config=config)
        listener = self.listener(workflow, started.run_id)
        self.runs.submit_job(f"run {started.run_id}", started.run_id,
                             lambda st: started.execute(listener=listener, store=st))
        return started.result

    async def fire(self, workflow: str, run_id: str, data: dict[str, Any]) -> None:
        """A trigger's run (`Firer`'s start): `begin` under the slot's id. A run
        refused for a missing key is each firing's logged error (`NotFired`)."""
        try:
            await self.begin(workflow, data, run_id)
        except NoKey as exc:
            raise NotFired(str(exc)) from None

    def refuse_unkeyed(self, workflow: str, what: str = "the run was not started") -> None:
        """`NoKey` when this server would execute a run (or a conversation's turn) of
        ``workflow`` and an agent node it may reach has no API key in this process --
        as ``interlock run`` refuses it: the nodes before the agent would run, with
        their effects, and the run would fail at it. With ``--workers 0`` the run is
        only recorded: the workers executing it may have the key."""
        wf = self.workflows.get(workflow)
        keys = unkeyed(wf.warnings) if wf is not None and not self.records_only else []
        if keys:
            raise NoKey(key_refusal(keys, KEY_FIX, what=what,
                                    here="in this server's environment"))

    async def stop(self) -> None:
        self.hub.stopping.set()
        await self._alongside.aclose()
        if self._firing is not None:
            self._firing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._firing
        for watcher in (self._watcher, self._chat_watcher):
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
        if self.polls is not None:
            await self.polls.close()
        if self.pool is not None:
            await self.pool.drain(self.options.drain)
        if self.loops is not None:
            await self.loops.close(max(self.options.drain, 1.0))
        if self.notifier is not None:
            await self.notifier.close()
        if self.chat is not None:
            await self.chat.close()
        if self.google_chat is not None:
            await self.google_chat.close()
        if self.store is not None:
            await self.store.close()

    def listener(self, workflow: str, run_id: str) -> Any:
        """What an execution in the server reports each record to: the notifier."""
        notifier, chat = self.notifier, self.chat
        observe = self.metrics.observe  # (thread-safe: prometheus_client's)
        api = self._api

        def listen(rec: dict[str, Any], view: RunView) -> None:
            observe(rec, view)
            if rec["type"] == "approval.requested" and notifier is not None:
                if api is None or _on(api):
                    notifier.requested(workflow, run_id, rec)
                else:  # from a run loop: the notifier lives on the API's
                    api.call_soon_threadsafe(notifier.requested, workflow, run_id, rec)
            if rec["type"] in ("approval.requested", "approval.decided") and chat is not None \
                    and chat.chats:
                if api is None or _on(api):
                    chat.changed(run_id, rec["seq"])
                else:
                    api.call_soon_threadsafe(chat.changed, run_id, rec["seq"])

        return listen

    async def launch(self, what: str, run_id: str, workflow: str,
                     call: Callable[[Any, Any], Awaitable[Any]]) -> None:
        """Execute ``call(listener, store)`` in the pool and return once its first record
        is committed (a decision, a resume): its refusals are raised here."""
        first: list[int] = []
        base = self.listener(workflow, run_id)
        call = self.streaming(run_id, call)

        def listen(rec: dict[str, Any], view: RunView) -> None:
            if not first:
                first.append(rec["seq"])
            base(rec, view)

        if self.records_only:  # recorded here and now, executed by a worker
            await call(listen, self.st)
            self.hub.changed(run_id)
            return
        task = self.runs.submit_job(what, run_id, lambda st: call(listen, st))
        await self.runs.accepted(run_id, task, first)

    def streaming(self, run_id: str, call: Callable[[Any, Any], Awaitable[Any]]
                  ) -> Callable[[Any, Any], Awaitable[Any]]:
        """``call`` with the replies of the conversation turns it runs streamed to the
        run's event streams (``chat.token``): a message's turn, and the rest of a turn a
        decision or a resume continues."""
        hub = self.hub

        def sink(piece: dict[str, object]) -> None:  # from the loop that executes the run
            hub.token(run_id, piece)

        async def streamed(listen: Any, st: Any) -> Any:
            token = TOKEN_SINK.set(sink)
            try:
                with hub.streaming(run_id):  # (its pieces tagged with its last commit)
                    return await call(listen, st)
            finally:
                TOKEN_SINK.reset(token)

        return streamed

    async def decide_gate(self, run_id: str, gate: str | None, decision: interlock.Decision,
                          via: str) -> None:
        """Decide one gate of a run (`interlock.support.decide_gate`) from this server --
        the API's decision, the dashboard's, a chat's click: executed here (or recorded
        for workers with ``--workers 0``, or for the process executing the run). Raises
        `Problemed` 403 for a decider the gate's ``approvers:`` refuse, 409 when the
        gate was decided already or the run waits no more, 422 for a gate the workflow
        has not; UsageError (400) for a
        decision the gate does not take."""
        row = await self.st.get_run(run_id)
        async with self.lock(run_id):
            try:
                await self.launch(
                    f"decision on run {run_id}", run_id, row.workflow,
                    lambda listen, st: decide_gate(
                        run_id, gate, decision, via=via, store=st,
                        workflow=self.workflows.get(row.workflow), listener=listen,
                        detach=self.records_only))
            except NotAnApprover as exc:
                raise Problemed(403, "Forbidden", str(exc)) from None
            except NoSuchGate as exc:  # the request's mistake, whatever the run's state
                raise Problemed(422, "Unprocessable Content", str(exc)) from None
            except (GateTaken, GateNotWaiting) as exc:
                raise Problemed(409, "Conflict", str(exc)) from None
            except interlock.UsageError as exc:
                status = (await self.st.get_run(run_id)).summary.status
                if status != "WAITING_APPROVAL":
                    raise Problemed(409, "Conflict", str(exc)) from None
                raise
        self.hub.changed(run_id)
        if self.chat is not None:
            self.chat.changed(run_id)  # the chats' messages of the gate: updated

    def resumer(self, run_id: str) -> Any:
        """The execution that continues a run (a takeover)."""

        async def go(st: Any) -> interlock.RunResult:
            row = await st.get_run(run_id)
            resume = self.streaming(run_id, lambda listen, st: interlock.resume(
                run_id, store=st, workflow=self.workflows.get(row.workflow), listener=listen))
            result: interlock.RunResult = await resume(self.listener(row.workflow, run_id), st)
            return result
        return self.runs.execution(run_id, go)

    def identify(self, authorization: str | None) -> Identity:
        if self.tokens is None:
            return LOCAL
        challenge = {"WWW-Authenticate": 'Bearer realm="interlock"'}
        scheme, _, token = (authorization or "").partition(" ")
        if not authorization or scheme.lower() != "bearer" or not token.strip():
            raise Problemed(401, "Unauthorized", "this server requires a token: send "
                            "'Authorization: Bearer <token>' (from the CLI: a command's "
                            "--token option, or $INTERLOCK_TOKEN)", challenge)
        who = self.tokens.identify(token.strip())
        if who is None:
            raise Problemed(401, "Unauthorized", "the token is not one this server knows "
                            "(its --auth file lists the SHA-256 digests of the valid ones)",
                            challenge)
        return who

    async def run_object(self, run_id: str) -> dict[str, Any]:
        return (await interlock.status(run_id, store=self.st)).to_json()


def _on(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether this thread runs ``loop``."""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


async def refuse_unkeyed_resume(server: Server, run_id: str) -> None:
    """`Server.refuse_unkeyed` for a resume of a stored run: only the agent nodes the run
    may still reach count (`resume_keys_missing`, the rule a foreground ``interlock
    resume`` follows), so a run past its agent resumes here without the key."""
    if server.records_only:
        return
    keys = await resume_keys_missing(server.st, run_id, None)
    if keys:
        raise NoKey(key_refusal(keys, KEY_FIX, what="the resume was not started",
                                here="in this server's environment"))
