"""A conversation's reply pieces (``chat.token``) in order on the run's event stream,
whenever the stream reads the log: a server busy enough to read late holds the next
model call's pieces too, and must still send each piece after the records committed
before it and before its call's ``agent.reply``. A real ``interlock serve`` app on
loopback in this process (uvicorn on a thread), so that a test can hold a stream's
reading of the log (`LateReads`) until the turns have run -- an event, not a sleep."""

from __future__ import annotations

import asyncio
import socket
import textwrap
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_server import events
from test_store_conformance import pg_schema_url  # noqa: F401 (a fixture)

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")

from interlock.server import ServerOptions, _routes_runs, create_app  # noqa: E402

TALK = """
workflow: talk
chat: assistant
nodes:
  assistant:
    agent:
      provider: scripted
      tools: [talknodes:lookup]
      replies:
        - content: let me look at db-7 first
          tool_calls: [{name: lookup, arguments: {host: db-7}}]
        - db-7 is down since noon, restarting it
        - the api answers in 40 ms
"""

NODES = '''
def lookup(host: str) -> dict:
    """What the monitoring says of a host."""
    return {"host": host, "up": False}
'''


class _Uvicorn(uvicorn.Server):  # type: ignore[misc]
    """uvicorn's server, telling when it has started (listening, lifespan done)."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.ready = threading.Event()

    async def startup(self, sockets: Any = None) -> None:
        self.loop = asyncio.get_running_loop()
        try:
            await super().startup(sockets=sockets)
        finally:
            self.ready.set()


class InProcess:
    """``create_app`` served by uvicorn on a thread, on a loopback port of its own."""

    def __init__(self, root: Path, store: str | None = None, **options: Any) -> None:
        self.app = create_app(ServerOptions(store=store or f"sqlite:///{root / 'runs.db'}",
                                            workflows=[str(root / "flows")], **options))
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = _Uvicorn(uvicorn.Config(self.app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run,
                                       kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        if not (self.server.ready.wait(60) and self.server.started):
            self.stop()
            raise AssertionError("the in-process server did not start")

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30)

    def stop(self) -> None:
        if self.server.started:  # the event streams end now, as under `interlock serve`
            self.server.loop.call_soon_threadsafe(self.app.state.interlock.hub.stopping.set)
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()


class LateReads:
    """Holds each event stream (but the test's own, which start after record 1: see
    `waiting_after`) once it has sent the record ``armed``, until ``release`` is set:
    the stream does not read the log meanwhile (its generator is not asked for more),
    while the reply pieces keep arriving in its buffer -- a stream that reads late, as on
    a busy server."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.armed: int | None = None
        self.held = threading.Event()  # a stream is being held
        self.release = threading.Event()
        real = _routes_runs.follow

        async def follow(server: Any, run_id: str, seq: int
                         ) -> AsyncIterator[Any]:
            async for event in real(server, run_id, seq):
                yield event
                if seq != 1 and self.armed is not None and event.id is not None \
                        and int(event.id) >= self.armed and not self.release.is_set():
                    self.held.set()
                    await asyncio.to_thread(self.release.wait, 60)

        monkeypatch.setattr(_routes_runs, "follow", follow)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("INTERLOCK_STORE", raising=False)
    monkeypatch.delenv("INTERLOCK_LOG_KEY", raising=False)
    (tmp_path / "talknodes.py").write_text(NODES)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "talk.yaml").write_text(textwrap.dedent(TALK))
    return tmp_path


@pytest.fixture(params=["sqlite", "memory", "postgres"])
def served(project: Path, request: pytest.FixtureRequest) -> Iterator[InProcess]:
    """The server on each kind of store: SQLite's and PostgreSQL's runs execute on run
    loops (their commits told from those threads), the memory store's on the API's."""
    url = {"sqlite": None, "memory": "memory://"}.get(request.param) \
        or request.getfixturevalue("pg_schema_url")
    server = InProcess(project, url)
    yield server
    server.stop()


def waiting_after(c: httpx.Client, run_id: str, seq: int) -> int:
    """Follow the run from its first record (a read `LateReads` neither holds nor counts
    as a whole log's) to its first ``run.waiting`` after ``seq``: its seq."""
    for ev in events(c, run_id, params={"after": 1}):
        if ev["event"] == "run.waiting" and int(ev["id"]) > seq:
            return int(ev["id"])
    raise AssertionError(f"run {run_id} ended without waiting after record {seq}")


def assert_in_order(seen: list[dict[str, Any]]) -> None:
    """Each model call's pieces come right after its ``agent.request`` and before its
    ``agent.reply``, and spell that reply; no piece anywhere else."""
    calls: list[str] = []
    current: list[str] | None = None
    for ev in seen:
        kind = ev["event"]
        if kind == "chat.token":
            assert current is not None, \
                f"a piece {ev['data']['text']!r} outside a model call: {kinds(seen)}"
            current.append(ev["data"]["text"])
        elif kind == "agent.request":
            current = []
        elif kind == "agent.reply":
            assert current is not None
            assert "".join(current) == ev["data"]["reply"], kinds(seen)
            calls.append("".join(current))
            current = None
        else:
            assert current is None, f"{kind} inside a model call: {kinds(seen)}"
    assert calls == ["let me look at db-7 first", "db-7 is down since noon, restarting it",
                     "the api answers in 40 ms"]


def kinds(seen: list[dict[str, Any]]) -> list[str]:
    return [e["event"] if e["event"] != "chat.token" else f"token:{e['data']['text']}"
            for e in seen]


def test_a_stream_that_reads_late_sends_each_calls_pieces_before_its_reply(
        served: InProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    late = LateReads(monkeypatch)
    with served.client() as c:
        assert c.post("/api/workflows/talk/runs", json={"run_id": "t1"}).status_code == 201
        start = waiting_after(c, "t1", 0)
        late.armed = start
        seen: list[dict[str, Any]] = []
        done = threading.Event()

        def subscribe() -> None:
            with served.client() as s:
                for ev in events(s, "t1", params={"after": start - 1}):
                    seen.append(ev)
                    if ev["event"] == "run.waiting" \
                            and sum(e["event"] == "chat.reply" for e in seen) == 2:
                        break
            done.set()

        reader = threading.Thread(target=subscribe)
        reader.start()
        assert late.held.wait(30)  # the stream has sent run.waiting, and reads no more
        # two turns while the stream does not read: a tool call (its text streamed), the
        # reply, then the next message's reply -- three model calls' pieces held
        for text in ("is db-7 up?", "and the api?"):
            r = c.post("/api/runs/t1/messages", json={"text": text})
            assert r.status_code == 202, r.text
            start = waiting_after(c, "t1", start)
        late.release.set()
        assert done.wait(60)
        reader.join(10)
    assert seen[0]["event"] == "run.waiting"
    assert_in_order(seen[1:])
    messages = [e["data"]["text"] for e in seen if e["event"] == "chat.message"]
    assert messages == ["is db-7 up?", "and the api?"]


def test_a_stream_that_closes_leaves_the_other_streams_their_pieces() -> None:
    from interlock.server._hub import Hub

    async def main() -> None:
        hub = Hub()
        with hub.streaming("r"), hub.tokens("r") as first:
            with hub.tokens("r"):
                pass  # (both buffers empty, so equal: the other one must stay subscribed)
            hub.committed("r", 7)
            hub.token("r", {"run_id": "r", "turn": 1, "text": "hi"})
            assert list(first) == [(7, {"run_id": "r", "turn": 1, "text": "hi"})]

    asyncio.run(main())
