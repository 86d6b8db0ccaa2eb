"""The engine (parent) side of `isolation: process`: `ProcessPool` and its workers'
lifecycle (spawn, reuse, timeouts, kills of process groups, reaping)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

import orjson

from ..._errors import NodeError, NodeTimeout
from .._origin import located
from ._protocol import _TB_LIMIT, _encode, _size, _text

if TYPE_CHECKING:
    from ..._json import JSON
    from .._context import Context, Goto, Port

STARTUP_TIMEOUT = 30.0  # seconds a new worker may take to import and report ready
REAP_TIMEOUT = 10.0  # seconds to wait for a SIGKILLed worker to be reaped
EXIT_GRACE = 1.0  # after a worker exits, how long its pipe may stay open (a grandchild)
CRASH = "WorkerCrashError"  # the exception name of a worker that died


@dataclass(frozen=True, slots=True)
class ChildContext:
    """What an isolated node's ``ctx`` knows (sent to the worker as JSON)."""

    run_id: str
    node: str
    visit: int
    attempt: int
    idempotency_key: str
    config: Mapping[str, object] = field(default_factory=dict)
    args: Mapping[str, object] = field(default_factory=dict)
    item_index: int | None = None  # a mapped node's item

    @classmethod
    def of(cls, ctx: Context) -> ChildContext:
        return cls(ctx.run_id, ctx.node, ctx.visit, ctx.attempt, ctx.idempotency_key,
                   dict(ctx.config), dict(ctx.args), ctx.item_index)

    def to_json(self) -> dict[str, Any]:
        out = {"run_id": self.run_id, "node": self.node, "visit": self.visit,
               "attempt": self.attempt, "idempotency_key": self.idempotency_key,
               "config": dict(self.config), "args": dict(self.args)}
        if self.item_index is not None:
            out["item_index"] = self.item_index
        return out


@dataclass(frozen=True, slots=True)
class Effects:
    """How ``ctx.once`` in a worker reaches the run's effect journal: ``recorded(key)``
    -> (found, value) and ``await record(key, result)`` -> the committed value.
    For a runner: ``Effects.of(runner, ctx)``."""

    recorded: Callable[[str], tuple[bool, JSON]]
    record: Callable[[str, object], Awaitable[JSON]]

    @classmethod
    def of(cls, runner: Port, ctx: Context) -> Effects:
        return cls(lambda key: runner.recorded_effect(ctx, key),
                   lambda key, result: runner.record_effect(ctx, key, result))


@dataclass(frozen=True, slots=True)
class ChildResult:
    """The outcome of one isolated call.

    ``update`` is what the node returned (JSON data: a mapping or None; for
    ``interlock.goto(node, update)`` the goto's update, with ``goto`` set to ``node``).
    ``error`` is None or ``{"exception", "message", "traceback", "mro", "kind"}`` with
    kind one of load, raised, shape, result, state, start, crashed. ``tokens`` were
    recorded by the node (and already passed to ``on_tokens``), ``duration_ms`` is the
    whole call as the engine saw it, ``pid`` the worker's, ``reused`` whether the worker
    had run an earlier call.
    """

    update: Any = None
    goto: str | None = None
    tokens: int = 0
    error: dict[str, Any] | None = None
    duration_ms: float = 0.0
    pid: int | None = None
    reused: bool = False

    def returned(self) -> Mapping[str, object] | Goto | None:
        """The node's return value as the runner expects it (a `Goto` for a goto)."""
        if self.goto is None:
            return self.update  # type: ignore[no-any-return]
        from .._context import Goto

        return Goto(self.goto, self.update)

    def node_error(self, node: str) -> NodeError | None:
        """``error`` as the `NodeError` an in-process call would have produced."""
        e = self.error
        if e is None:
            return None
        exc, message, kind = e.get("exception") or "Exception", e.get("message", ""), e.get("kind")
        if kind == "raised":
            text = located(f"node {node!r} raised {exc}: {message}", e.get("at"))
        elif kind == "result":
            text = f"node {node!r} returned a value that is not JSON data: {message}"
        elif kind == "shape":
            text = f"node {node!r} {message}"
        elif kind == "crashed":
            text = f"node {node!r} crashed: {message}"
        elif kind == "load":
            text = f"node {node!r} could not be loaded in its worker process: {exc}: {message}"
        else:  # state, start
            text = f"node {node!r} could not run in a worker process: {message}"
        details: dict[str, Any] = {"exception": exc, "isolation": "process"}
        for key in ("mro", "traceback", "exit_code", "at"):
            if e.get(key) is not None and e.get(key) != "":
                details[key] = e[key]
        return NodeError(text, node=node, **details)

    def value(self, node: str) -> Mapping[str, object] | Goto | None:
        """The return value, or raise `node_error`: ``return res.value(pn.name)``."""
        err = self.node_error(node)
        if err is not None:
            raise err
        return self.returned()


class _Died(Exception):
    """The worker's pipe closed before the reply came."""

    def __init__(self, started: bool = False) -> None:
        super().__init__("worker died")
        self.started = started


class _StartError(Exception):
    pass


class _Pipe(asyncio.SubprocessProtocol):
    """Receives a worker's JSON lines and notices its exit."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._buf = bytearray()
        self._lines: deque[bytes | bytearray] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self.pid = 0
        self.eof = False
        self.exited: asyncio.Future[None] = loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.SubprocessTransport)
        self.pid = transport.get_pid()

    def pipe_data_received(self, fd: int, data: bytes | bytearray) -> None:
        if fd != 1:
            return
        self._buf += data
        if b"\n" in data:  # only the new bytes are searched: large replies stay linear
            *lines, rest = self._buf.split(b"\n")
            self._lines.extend(lines)
            self._buf = bytearray(rest)
            self._wake()

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if fd == 1:
            self.eof = True
            self._wake()

    def process_exited(self) -> None:
        # take down whatever the worker started; then give a pipe still held open by an
        # escaped grandchild a moment before calling it closed
        _killpg(self.pid)
        if not self.exited.done():
            self.exited.set_result(None)
        self._loop.call_later(EXIT_GRACE, self._close_pipe)
        self._wake()

    def _close_pipe(self) -> None:
        self.eof = True
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    @property
    def pending(self) -> int:
        return len(self._lines)

    async def recv(self) -> dict[str, Any]:
        while not self._lines:
            if self.eof:
                raise _Died()
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        msg: dict[str, Any] = orjson.loads(self._lines.popleft())
        return msg


class _Worker:
    __slots__ = ("calls", "crash_file", "env_key", "memory", "pid", "pipe", "reaper", "stdin",
                 "transport")

    def __init__(self, transport: asyncio.SubprocessTransport, pipe: _Pipe, memory: int | None,
                 env_key: int, crash_file: IO[bytes]) -> None:
        self.transport = transport
        self.pipe = pipe
        self.pid: int = transport.get_pid()
        stdin = transport.get_pipe_transport(0)
        assert isinstance(stdin, asyncio.WriteTransport)
        self.stdin = stdin
        self.memory = memory
        self.env_key = env_key
        self.crash_file = crash_file
        self.calls = 0
        self.reaper: asyncio.Task[None] | None = None

    def send(self, msg: Mapping[str, object] | bytes) -> None:
        self.stdin.write(msg if isinstance(msg, bytes) else _encode(msg))


def _killpg(pgid: int) -> None:
    if pgid <= 0:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _env_key() -> int:
    return hash(tuple(os.environ.items()))


def _sys_path() -> list[str]:
    return [os.fsdecode(p) for p in sys.path if isinstance(p, str | bytes | os.PathLike)]


def _main_info() -> dict[str, Any]:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return {"name": getattr(spec, "name", None), "file": getattr(main, "__file__", None)}


def _interpreter_flags() -> list[str]:
    # -X, -W, -E, -s, -O ... of this interpreter, as multiprocessing passes them on
    flags = getattr(subprocess, "_args_from_interpreter_flags", None)
    return list(flags()) if callable(flags) else []


def _raise_reply(exc: BaseException) -> dict[str, Any]:
    return {"t": "raise", "exception": type(exc).__name__, "module": type(exc).__module__,
            "message": _text(exc)}


def _exit_text(rc: int | None) -> str:
    if rc is None:
        return "closed its pipe and did not exit"
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        return f"died with signal {name}"
    return f"exited with code {rc}"


class ProcessPool:
    """Worker processes for ``isolation: process`` nodes. Use from one event loop.

    ``max_idle`` caps the workers kept for reuse (default ``os.cpu_count()``); the
    number running at once is not capped (one per concurrent call).
    """

    def __init__(self, *, max_idle: int | None = None,
                 startup_timeout: float = STARTUP_TIMEOUT) -> None:
        self.max_idle = max_idle if max_idle is not None else (os.cpu_count() or 4)
        self.startup_timeout = startup_timeout
        self.spawned = 0  # workers started so far
        self._idle: list[_Worker] = []
        self._live: set[_Worker] = set()
        self._closed = False

    @property
    def idle(self) -> int:
        return len(self._idle)

    def pids(self) -> list[int]:
        """Pids of the workers alive now (busy or idle)."""
        return sorted(w.pid for w in self._live)

    async def __aenter__(self) -> ProcessPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- a call ------------------------------------------------------------------------

    async def call(self, call_path: str, state: Mapping[str, object], ctx: ChildContext, *,
                   timeout: float | None, memory: int | None = None,
                   on_tokens: Callable[[int], None] | None = None,
                   effects: Effects | None = None) -> ChildResult:
        """Run ``call_path`` (``module:function``) on ``state`` in a worker process.

        ``timeout`` (seconds) bounds the call once the worker has it: past it the
        worker's process group is killed and reaped and ``NodeTimeout`` is raised. A
        cancelled caller gets the same kill, then ``CancelledError``. ``memory``
        (bytes) runs the call in a fresh worker limited to that much address space.
        ``on_tokens(n)`` is called for every ``ctx.record_tokens(n)`` as it happens;
        what it raises is raised inside the node. ``effects`` backs ``ctx.once``.
        Every other failure -- of the node or of its worker -- is returned in
        ``ChildResult.error``; besides NodeTimeout and CancelledError, `call` raises only
        RuntimeError (the pool is closed) and ValueError (``memory`` is not positive).
        """
        if self._closed:
            raise RuntimeError("the process pool is closed")
        if memory is not None and memory <= 0:
            raise ValueError(f"memory must be a positive number of bytes, got {memory!r}")
        t0 = time.perf_counter()
        try:
            request = _encode({"t": "call", "call": call_path, "state": state,
                               "ctx": ctx.to_json(),
                               "env": {"cwd": os.getcwd(), "path": _sys_path(),
                                       "main": _main_info()}})
        except TypeError as exc:
            return self._failed(t0, "state", "TypeError",
                                f"its state (or ctx.config) is not JSON data: {exc}")
        tokens = [0]
        while True:
            try:
                worker, reused = await self._acquire(memory)
            except _StartError as exc:
                return self._failed(t0, "start", CRASH, str(exc))
            try:
                async with asyncio.timeout(timeout):
                    reply = await self._exchange(worker, request, tokens, on_tokens, effects)
            except TimeoutError:
                await asyncio.shield(self._kill(worker))
                raise NodeTimeout(f"node {ctx.node!r} timed out after {timeout:g}s; its worker "
                                  f"process (pid {worker.pid}) was killed") from None
            except _Died as died:
                if reused and not died.started:
                    # an idle worker had died before it got the call (nothing ran): retry
                    # with the next one (each retry uses up an idle worker, then spawns)
                    await asyncio.shield(self._kill(worker))
                    continue
                return await self._crashed(worker, t0, tokens[0], memory, reused)
            except BaseException:  # cancelled (or a bug here): never leave the worker running
                reaper = self._kill(worker)
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.shield(reaper)
                raise
            return await self._finish(worker, reply, t0, tokens[0], reused)

    async def _exchange(self, w: _Worker, request: bytes, tokens: list[int],
                        on_tokens: Callable[[int], None] | None,
                        effects: Effects | None) -> dict[str, Any]:
        w.send(request)
        started = False
        while True:
            try:
                msg = await w.pipe.recv()
            except _Died:
                raise _Died(started) from None
            kind = msg.get("t")
            if kind == "start":
                started = True
                continue
            if kind in ("result", "error"):
                return msg
            if kind == "tokens":
                n = int(msg["n"])
                tokens[0] += n
                reply: dict[str, Any] = {"t": "ok"}
                if on_tokens is not None:
                    try:
                        on_tokens(n)
                    except Exception as exc:
                        reply = _raise_reply(exc)
            elif kind in ("once", "effect"):
                reply = await self._effect(msg, effects)
            else:
                raise _Died(started)  # not our protocol: treat the worker as broken
            w.send(reply)

    async def _effect(self, msg: dict[str, Any], effects: Effects | None) -> dict[str, Any]:
        if effects is None:
            return _raise_reply(NodeError(
                "ctx.once is not available in an isolated node yet (the engine passed no "
                "effect journal to the worker)"))
        try:
            if msg["t"] == "once":
                found, value = effects.recorded(msg["key"])
                return {"t": "found", "value": value} if found else {"t": "missing"}
            return {"t": "value", "value": await effects.record(msg["key"], msg.get("result"))}
        except Exception as exc:
            return _raise_reply(exc)

    async def _finish(self, w: _Worker, reply: dict[str, Any], t0: float, tokens: int,
                      reused: bool) -> ChildResult:
        w.calls += 1
        error = reply.get("error")
        if error is not None and w.memory is not None and error.get("exception") == "MemoryError":
            error["message"] = (error.get("message") or "out of memory") + \
                f" (its memory limit is {_size(w.memory)})"
        if (error is not None and _retires(error)) or not self._keep(w):
            await self._kill(w)
        else:
            self._idle.append(w)
        return ChildResult(update=reply.get("update"), goto=reply.get("goto"), tokens=tokens,
                           error=error, duration_ms=_ms(t0), pid=w.pid, reused=reused)

    def _keep(self, w: _Worker) -> bool:
        return not self._closed and w.memory is None and w.pipe.pending == 0 \
            and not w.pipe.eof and not w.pipe.exited.done() and len(self._idle) < self.max_idle

    async def _crashed(self, w: _Worker, t0: float, tokens: int, memory: int | None,
                       reused: bool) -> ChildResult:
        # let the worker finish dying on its own, so its exit status is its own
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(w.pipe.exited), 2.0)
        rc = w.transport.get_returncode()
        stack = ""
        with contextlib.suppress(OSError, ValueError):
            w.crash_file.seek(0)  # faulthandler's output: most recent call first
            stack = w.crash_file.read(_TB_LIMIT).decode("utf-8", "replace")
        await self._kill(w)
        text = f"its worker process (pid {w.pid}) {_exit_text(rc)}"
        if self._closed:
            text += " (the process pool was closed)"
        elif rc == -signal.SIGKILL:
            text += " (killed from outside -- by the kernel's out-of-memory killer?)"
        if memory is not None:
            text += f"; it ran with a memory limit of {_size(memory)}, which it may have exceeded"
        error = {"exception": CRASH, "message": text, "traceback": stack, "kind": "crashed",
                 "exit_code": rc}
        return ChildResult(tokens=tokens, error=error, duration_ms=_ms(t0), pid=w.pid,
                           reused=reused)

    def _failed(self, t0: float, kind: str, exc: str, message: str) -> ChildResult:
        return ChildResult(error={"exception": exc, "message": message, "traceback": "",
                                  "kind": kind}, duration_ms=_ms(t0))

    # -- workers -------------------------------------------------------------------------

    async def _acquire(self, memory: int | None) -> tuple[_Worker, bool]:
        if memory is None:
            key = _env_key()
            while self._idle:
                w = self._idle.pop()
                if w.env_key == key and not w.pipe.eof and not w.pipe.exited.done():
                    return w, True
                await self._kill(w)
        return await self._spawn(memory), False

    async def _spawn(self, memory: int | None) -> _Worker:
        loop = asyncio.get_running_loop()
        self.spawned += 1
        # where faulthandler writes the stack of a fatal signal: a file with no name, so
        # nothing is left on disk whatever happens to the engine
        crash_file = tempfile.TemporaryFile()  # noqa: SIM115 -- the worker's; closed by _reap
        args = [sys.executable, *_interpreter_flags(), "-m", "interlock._engine._isolation",
                "--parent", str(os.getpid()), "--crash-fd", str(crash_file.fileno())]
        if memory is not None:
            args += ["--memory", str(memory)]
        pipe = _Pipe(loop)
        try:
            transport, _ = await loop.subprocess_exec(
                lambda: pipe, *args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=None, start_new_session=True, cwd=os.getcwd(),
                pass_fds=(crash_file.fileno(),))
        except BaseException as exc:
            crash_file.close()
            if isinstance(exc, OSError):
                raise _StartError(f"cannot start a worker process ({sys.executable}): "
                                  f"{exc}") from None
            raise
        w = _Worker(transport, pipe, memory, _env_key(), crash_file)
        self._live.add(w)
        try:
            async with asyncio.timeout(self.startup_timeout):
                ready = await pipe.recv()
        except TimeoutError:
            await asyncio.shield(self._kill(w))
            raise _StartError(f"its worker process (pid {w.pid}) did not start within "
                              f"{self.startup_timeout:g}s") from None
        except _Died:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(pipe.exited), 2.0)
            rc = transport.get_returncode()
            await asyncio.shield(self._kill(w))
            raise _StartError(f"its worker process (pid {w.pid}) {_exit_text(rc)} while "
                              "starting (its stderr says why)") from None
        except BaseException:
            reaper = self._kill(w)
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(reaper)
            raise
        if ready.get("error"):
            await self._kill(w)
            raise _StartError(str(ready["error"]))
        if self._closed:  # closed while this worker was starting
            await self._kill(w)
            raise RuntimeError("the process pool is closed")
        return w

    def _kill(self, w: _Worker) -> asyncio.Task[None]:
        """SIGKILL the worker's process group (once) and return the task that reaps it."""
        if w.reaper is None:
            with contextlib.suppress(ValueError):
                self._idle.remove(w)
            _killpg(w.pid)
            w.reaper = asyncio.get_running_loop().create_task(self._reap(w))
        return w.reaper

    async def _reap(self, w: _Worker) -> None:
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(w.pipe.exited), REAP_TIMEOUT)
        finally:
            w.transport.close()
            self._live.discard(w)
            w.crash_file.close()

    async def close(self) -> None:
        """Kill every worker (idle or busy) and wait until each is reaped. Idempotent."""
        self._closed = True
        self._idle.clear()
        reapers = [self._kill(w) for w in list(self._live)]
        if reapers:
            await asyncio.shield(asyncio.gather(*reapers, return_exceptions=True))


def _retires(error: Mapping[str, Any]) -> bool:
    mro = error.get("mro") or []
    return "MemoryError" in mro or "Exception" not in mro


def _ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1000, 3)
