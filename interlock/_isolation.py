"""Process isolation: run a node's body in a separate OS process (``isolation: process``).

The engine side is `ProcessPool`; `Runner` owns one (see "Lifetime" below) and calls
``await pool.call(call_path, state, ChildContext.of(ctx), timeout=..., memory=...)``
from the event loop. The worker side is this same file run as
``python -m interlock._isolation``.

Workers
-------
A worker is a fresh interpreter (``sys.executable -m interlock._isolation``; fork+exec,
so nothing of a threaded parent is inherited) started in its **own session**, so its
process group id is its pid and ``os.killpg(pid, SIGKILL)`` also takes any process the
node started. Engine and worker talk JSON lines (orjson) over the worker's
stdin/stdout; the worker moves those pipes to private descriptors first, so a node's
``print`` goes to stderr (inherited) and cannot corrupt the protocol.

Every call sends the function's ``module:function`` path, the state (JSON), a
`ChildContext` and the engine's cwd, ``sys.path`` and ``__main__`` (file or module
name), so the worker imports exactly what the engine can -- ``__main__:fn`` is loaded
from the engine's main file under the name ``__mp_main__``, as multiprocessing's spawn
does. Only module-level functions can be imported by path: a lambda, a nested function
or a builder-renamed duplicate (``mod:fn#2``) fails with an error saying so.

Reuse: a worker runs one call at a time and is kept idle afterwards (at most
``max_idle``, default ``os.cpu_count()``). It is killed instead when its call timed
out, was cancelled, crashed, raised MemoryError or a BaseException (SystemExit...),
when the call had a ``memory`` limit (such calls always get a fresh, dedicated worker
that sets RLIMIT_AS before importing any user code), or when the engine's environment
variables changed since it started. A worker also restores its environment variables
after every call. What a node leaves behind in other process-global state (module
globals, signal handlers, threads) is seen by the next call in that worker -- as it
would be in-process.

Failures
--------
- timeout (measured from when the request is sent; worker start-up is bounded
  separately by ``startup_timeout``): the worker's process group is SIGKILLed and
  reaped, then `call` **raises** ``TimeoutError`` -- the runner's timeout path.
- cancellation of the awaiting task: kill, reap, re-raise ``CancelledError``.
- the node raised: ``ChildResult.error`` (``kind: "raised"``) with the exception's
  type name, message, MRO names and traceback; the worker is reused unless it was a
  MemoryError or not an ``Exception``.
- the worker died (segfault, ``os._exit``, killed, failed malloc under its memory
  limit): ``ChildResult.error`` with ``exception: "WorkerCrashError"`` and the exit
  code or signal name, plus the Python stack faulthandler wrote on a fatal signal.
- state or return value that is not JSON data: ``ChildResult.error`` (``kind:
  "state"`` / ``"result"``); a return value that is not a mapping, None or
  ``interlock.goto(...)``: ``kind: "shape"``.
`ChildResult.value(node)` turns any of these into the `NodeError` the runner records.
`call` never raises for a failure of the node or its worker; it raises only
``TimeoutError``, ``CancelledError``, and ``RuntimeError`` when the pool is closed.

``ctx`` in the worker
---------------------
An `IsolatedContext`: ``run_id``, ``node``, ``visit``, ``attempt``,
``idempotency_key``, ``config``, ``tokens``, ``record_tokens(n)`` and ``await
ctx.once(key, fn, *args)``. Both methods are a round trip to the engine: tokens are
charged to the run as they are recorded (so budgets apply, and an exceeded budget is
raised inside the node as in-process), and ``once`` consults and commits the run's
effect journal through the `Effects` the runner passes -- without one, ``once``
raises NodeError "ctx.once is not available in an isolated node yet".

If the engine process dies, idle workers see end-of-file and exit; a busy worker is
killed by the kernel (``PR_SET_PDEATHSIG``, Linux).

Lifetime
--------
One pool per `Runner` (created on the first isolated call, closed when the run
stops): a pool's workers are asyncio subprocesses bound to the event loop that
started them, and ``Workflow.run_sync`` runs each run in a new loop, so a
process-wide pool would outlive its loop. A long-lived service that wants reuse
across runs can create one pool per loop and pass it in.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import orjson

# ---------------------------------------------------------------------------------------
# The worker (child) side. Only the standard library and orjson: no pydantic, and no
# asyncio until the first async node (it is the costliest import left) -- this runs on
# every cold start. The engine side below is never even defined in a worker.
# ---------------------------------------------------------------------------------------

_RESERVE = 4 << 20  # bytes set aside under a memory limit, freed to report a MemoryError
_TB_LIMIT = 4000
_MAIN: dict[str, Any] = {}  # the engine's __main__: {"name": ..., "file": ...}


def _json_default(obj: Any) -> Any:
    # the conversions of _log (pydantic models, sets, tuples), imported only when needed
    from ._log import json_default as _default

    return _default(obj)


def _encode(msg: Mapping[str, Any]) -> bytes:
    return orjson.dumps(msg, default=_json_default, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"


def _clean(text: str) -> str:
    """``text`` without lone surrogates (orjson rejects them)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class _Channel:
    """The worker's end of the protocol: JSON lines in, JSON lines out."""

    def __init__(self, rfd: int, wfd: int) -> None:
        self._r = os.fdopen(rfd, "rb")
        self._w = os.fdopen(wfd, "wb")
        self.lock = threading.Lock()  # a node's threads may record tokens concurrently

    def send(self, data: bytes) -> None:
        self._w.write(data)
        self._w.flush()

    def recv(self) -> dict[str, Any] | None:
        line = self._r.readline()
        if not line:
            return None
        msg: dict[str, Any] = orjson.loads(line)
        return msg

    def ask(self, msg: Mapping[str, Any]) -> dict[str, Any]:
        """Send ``msg`` and wait for the engine's reply; raise what the engine says to."""
        data = _encode(msg)  # TypeError when the caller's value is not JSON data
        with self.lock:
            self.send(data)
            reply = self.recv()
        if reply is None:  # the engine went away
            os._exit(0)
        if reply.get("t") == "raise":
            raise _exception_from(reply)
        return reply


def _exception_from(reply: Mapping[str, Any]) -> Exception:
    """Rebuild an exception the engine raised (a budget exceeded, a store failure)."""
    import importlib

    name = str(reply.get("exception") or "RuntimeError")
    module = str(reply.get("module") or "builtins")
    message = str(reply.get("message", ""))
    cls: Any = None
    if module == "builtins":
        import builtins

        cls = getattr(builtins, name, None)
    elif module.split(".")[0] == "interlock":
        try:
            cls = getattr(importlib.import_module(module), name, None)
        except ImportError:
            cls = None
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            exc: Exception = cls(message)
            return exc
        except Exception:
            pass
    return RuntimeError(f"{name}: {message}")


class IsolatedContext:
    """The ``ctx`` an isolated node receives: `interlock.Context`'s attributes and methods,
    with ``record_tokens`` and ``once`` going to the engine and back."""

    __slots__ = ("_chan", "_live", "_tokens", "attempt", "config", "idempotency_key", "node",
                 "run_id", "visit")

    def __init__(self, chan: _Channel, data: Mapping[str, Any]) -> None:
        self._chan = chan
        self._live = True
        self._tokens = 0
        self.run_id: str = data["run_id"]
        self.node: str = data["node"]
        self.visit: int = data["visit"]
        self.attempt: int = data["attempt"]
        self.idempotency_key: str = data["idempotency_key"]
        self.config: Mapping[str, Any] = data.get("config") or {}

    @property
    def tokens(self) -> int:
        """Tokens this attempt has recorded so far."""
        return self._tokens

    def _check_live(self) -> None:
        if not self._live:
            raise RuntimeError(f"the call of node {self.node!r} this context belongs to has "
                               "returned; its ctx cannot be used any more")

    def record_tokens(self, n: int) -> None:
        """Charge ``n`` tokens to this node and to the run's budget (a round trip to the
        engine; raises BudgetExceededError when a budget is crossed)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"record_tokens takes a non-negative int, got {n!r}")
        self._check_live()
        self._tokens += n
        self._chan.ask({"t": "tokens", "n": n})

    async def once(self, key: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Run the side effect ``fn(*args)`` once for this visit and ``key`` (see
        `interlock.Context.once`); the result is committed by the engine before it is
        returned."""
        self._check_live()
        reply = self._chan.ask({"t": "once", "key": key})
        if reply.get("t") == "found":
            return reply.get("value")
        result = fn(*args)
        if hasattr(result, "__await__"):
            result = await result
        return self._chan.ask({"t": "effect", "key": key, "result": result}).get("value")

    def __repr__(self) -> str:
        return (f"<IsolatedContext run={self.run_id} node={self.node} visit={self.visit} "
                f"attempt={self.attempt} pid={os.getpid()}>")


def _main_module() -> Any:
    """The engine's ``__main__``, as multiprocessing's spawn loads it: by module name
    (``python -m pkg.mod``) or from its file under the name ``__mp_main__`` (its
    ``if __name__ == "__main__":`` block does not run)."""
    import importlib
    import importlib.util

    loaded = sys.modules.get("__mp_main__")
    if loaded is not None:
        return loaded
    name, file = _MAIN.get("name"), _MAIN.get("file")
    if name and name != "__main__":
        module = importlib.import_module(name)
    elif file:
        spec = importlib.util.spec_from_file_location("__mp_main__", file)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load the engine's main script {file}")
        module = importlib.util.module_from_spec(spec)
        sys.modules["__mp_main__"] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules["__mp_main__"]
            raise
    else:
        raise ImportError("the function is defined in the engine's __main__, which has no "
                          "file (an interactive session or python -c); define it in a module")
    sys.modules["__mp_main__"] = module
    return module


def _resolve(path: str, cache: dict[str, tuple[Callable[..., Any], bool]]
             ) -> tuple[Callable[..., Any], bool]:
    """``module:attr.attr`` -> (function, wants ctx), like `interlock._plan.import_callable`."""
    hit = cache.get(path)
    if hit is not None:
        return hit
    import importlib

    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ImportError(f"{path!r} is not a 'module:function' path")
    if "#" in attr or "<locals>" in attr or "<lambda>" in attr:
        raise ImportError(
            f"{path} is a lambda, a nested function or one of several functions with the "
            "same name; a node with isolation: process must be a module-level function "
            "with a unique name, because its worker process imports it by path")
    if module_name == "__main__":
        obj: Any = _main_module()
    else:
        if module_name not in sys.modules:
            importlib.invalidate_caches()  # modules written since the worker started
        try:
            obj = importlib.import_module(module_name)
        except ImportError as exc:
            raise ImportError(f"cannot import module {module_name!r}: {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise AttributeError(f"module {module_name!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise TypeError(f"{path} is a {type(obj).__name__}, not a function")
    from ._signature import param_count

    entry = (obj, param_count(obj) >= 2)
    cache[path] = entry
    return entry


def _sync_env(env: Mapping[str, Any] | None) -> None:
    """Take the engine's cwd, sys.path and __main__ (sent with every call)."""
    if not env:
        return
    cwd = env.get("cwd")
    if cwd and cwd != os.getcwd():
        os.chdir(cwd)
    path = env.get("path")
    if isinstance(path, list):
        if "" not in path and "." not in path:
            path = ["", *path]  # the working directory is importable (import_callable)
        if sys.path != path:
            sys.path[:] = path
    main = env.get("main")
    if isinstance(main, dict) and main != _MAIN:
        _MAIN.clear()
        _MAIN.update(main)
        sys.modules.pop("__mp_main__", None)


_LOOP: list[Any] = []  # the worker's event loop, made by its first async node


async def _awaited(aw: Any) -> Any:
    return await aw


def _run_async(aw: Any) -> Any:
    """Await ``aw`` on the worker's event loop, which lives as long as the worker (as the
    engine's loop does for an in-process node: clients bound to it keep working from one
    call to the next). Tasks the node leaves behind are cancelled, as asyncio.run does."""
    import asyncio

    if not _LOOP or _LOOP[0].is_closed():
        _LOOP[:] = [asyncio.new_event_loop()]
    loop = _LOOP[0]
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(_awaited(aw))
    finally:
        left = asyncio.all_tasks(loop)
        if left:
            for task in left:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))


def _invoke(fn: Callable[..., Any], wants_ctx: bool, state: Any, ctx: IsolatedContext) -> Any:
    result = fn(state, ctx) if wants_ctx else fn(state)
    if hasattr(result, "__await__"):
        result = _run_async(result)
    return result


def _format_tb(exc: BaseException) -> str:
    import traceback

    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next  # the worker's own frames say nothing about the node
    if isinstance(exc, MemoryError):
        traceback.clear_frames(exc.__traceback__)  # drop the node's locals: its memory
    lines = traceback.format_exception(type(exc), exc, tb, limit=-6)
    return _clean("".join(lines)[-_TB_LIMIT:])


def _text(exc: BaseException) -> str:
    try:
        return _clean(str(exc))
    except Exception:
        return f"<{type(exc).__name__} with an unprintable message>"


def _error_reply(exc: BaseException, kind: str, t0: float) -> bytes:
    try:
        tb = _format_tb(exc)
    except Exception:
        tb = ""
    error = {"exception": type(exc).__name__, "message": _text(exc), "traceback": tb,
             "mro": [c.__name__ for c in type(exc).__mro__], "kind": kind}
    return _encode({"t": "error", "error": error, "ms": (time.perf_counter() - t0) * 1000})


def _result_reply(result: Any, t0: float) -> bytes:
    goto: str | None = None
    update = result
    ctx_module = sys.modules.get("interlock._context")  # loaded if the node used goto()
    if ctx_module is not None and isinstance(result, ctx_module.Goto):
        goto, update = result.node, result.update
    if update is not None and not isinstance(update, Mapping):
        error = {"exception": "TypeError", "kind": "shape", "traceback": "",
                 "mro": ["TypeError", "Exception", "BaseException", "object"],
                 "message": f"returned {type(update).__name__}; a node returns a mapping of "
                            "state updates (or None, or interlock.goto(...) when its edge is "
                            "'choose')"}
        return _encode({"t": "error", "error": error})
    if update is not None and not isinstance(update, dict):
        update = dict(update)
    return _encode({"t": "result", "update": update, "goto": goto,
                    "ms": (time.perf_counter() - t0) * 1000})


def _run_call(chan: _Channel, msg: Mapping[str, Any],
              cache: dict[str, tuple[Callable[..., Any], bool]],
              reserve: list[bytearray]) -> tuple[bytes, bool]:
    """Run one call; return the reply and whether this worker must not be reused."""
    t0 = time.perf_counter()
    try:
        _sync_env(msg.get("env"))
        fn, wants_ctx = _resolve(str(msg["call"]), cache)
    except Exception as exc:
        return _error_reply(exc, "load", t0), False
    ctx = IsolatedContext(chan, msg["ctx"])
    try:
        result = _invoke(fn, wants_ctx, msg["state"], ctx)
    except BaseException as exc:  # the node's failure, SystemExit included
        if isinstance(exc, MemoryError):
            reserve.clear()  # room to describe it
        retire = isinstance(exc, MemoryError) or not isinstance(exc, Exception)
        return _error_reply(exc, "raised", t0), retire
    finally:
        ctx._live = False
    try:
        return _result_reply(result, t0), False
    except MemoryError as exc:
        reserve.clear()
        return _error_reply(exc, "result", t0), True
    except (TypeError, ValueError) as exc:  # orjson.JSONEncodeError is a TypeError
        return _error_reply(exc, "result", t0), False


def _serve(chan: _Channel, reserve: list[bytearray]) -> int:
    cache: dict[str, tuple[Callable[..., Any], bool]] = {}
    environ = dict(os.environ)
    while True:
        msg = chan.recv()
        if msg is None:  # the engine closed the pipe: done
            return 0
        if msg.get("t") != "call":
            sys.stderr.write(f"interlock worker: unexpected message {msg.get('t')!r}\n")
            return 70
        chan.send(b'{"t":"start"}\n')
        reply, retire = _run_call(chan, msg, cache, reserve)
        with chan.lock:
            chan.send(reply)
        if retire:
            return 0  # the engine kills this worker; nothing more to do
        if os.environ != environ:  # a node's environment changes do not leak into the next
            os.environ.clear()
            os.environ.update(environ)


def _die_with_parent(ppid: int) -> None:
    """Have the kernel SIGKILL this worker when the engine process dies (Linux)."""
    if not sys.platform.startswith("linux") or not ppid:
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    except (OSError, AttributeError):
        return
    if os.getppid() != ppid:  # the engine died before prctl
        os._exit(1)


def _limit_memory(limit: int) -> None:
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _address_space() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _worker_main(argv: list[str]) -> int:
    """``python -m interlock._isolation --parent PID [--memory BYTES] [--crash-fd FD]``."""
    opts = dict(zip(argv[::2], argv[1::2], strict=False))
    # the protocol moves to private descriptors (not inherited by the node's own
    # subprocesses); fd 0 reads /dev/null and fd 1 (print) writes to stderr
    rfd, wfd = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    _die_with_parent(int(opts.get("--parent", "0")))
    import faulthandler

    try:  # the Python stack of a fatal signal, into a nameless file the engine reads
        faulthandler.enable(int(opts["--crash-fd"]))
    except (KeyError, ValueError, OSError):
        faulthandler.enable()  # to stderr
    chan = _Channel(rfd, wfd)
    reserve: list[bytearray] = []
    ready: dict[str, Any] = {"t": "ready", "pid": os.getpid()}
    memory = opts.get("--memory")
    if memory:
        used = _address_space()
        try:
            _limit_memory(int(memory))
            reserve.append(bytearray(_RESERVE))
        except (MemoryError, ValueError, OSError) as exc:
            ready["error"] = (f"cannot run under a memory limit of {_size(int(memory))}: the "
                              f"worker process alone uses {_size(used)} of address space "
                              f"({type(exc).__name__}: {exc})")
    chan.send(_encode(ready))
    if "error" in ready:
        return 1
    return _serve(chan, reserve)


def _size(n: int) -> str:
    for unit, scale in (("GB", 1000**3), ("MB", 1000**2), ("kB", 1000)):
        if n >= scale:
            return f"{n / scale:.4g}{unit}"
    return f"{n}B"


if __name__ == "__main__":  # a worker: stop before defining (and importing) the engine side
    sys.exit(_worker_main(sys.argv[1:]))

# ---------------------------------------------------------------------------------------
# The engine (parent) side.
# ---------------------------------------------------------------------------------------

import asyncio  # noqa: E402 -- below the worker's entry point on purpose (start-up cost)
import contextlib  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
from collections import deque  # noqa: E402
from collections.abc import Awaitable  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from typing import IO, TYPE_CHECKING  # noqa: E402

from ._errors import NodeError  # noqa: E402

if TYPE_CHECKING:
    from ._context import Context, Goto

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
    config: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, ctx: Context) -> ChildContext:
        return cls(ctx.run_id, ctx.node, ctx.visit, ctx.attempt, ctx.idempotency_key,
                   dict(ctx.config))

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "node": self.node, "visit": self.visit,
                "attempt": self.attempt, "idempotency_key": self.idempotency_key,
                "config": dict(self.config)}


@dataclass(frozen=True, slots=True)
class Effects:
    """How ``ctx.once`` in a worker reaches the run's effect journal: ``recorded(key)``
    -> (found, value) and ``await record(key, result)`` -> the committed value.
    For a runner: ``Effects.of(runner, ctx)``."""

    recorded: Callable[[str], tuple[bool, Any]]
    record: Callable[[str, Any], Awaitable[Any]]

    @classmethod
    def of(cls, runner: Any, ctx: Context) -> Effects:
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

    def returned(self) -> Mapping[str, Any] | Goto | None:
        """The node's return value as the runner expects it (a `Goto` for a goto)."""
        if self.goto is None:
            return self.update  # type: ignore[no-any-return]
        from ._context import Goto

        return Goto(self.goto, self.update)

    def node_error(self, node: str) -> NodeError | None:
        """``error`` as the `NodeError` an in-process call would have produced."""
        e = self.error
        if e is None:
            return None
        exc, message, kind = e.get("exception") or "Exception", e.get("message", ""), e.get("kind")
        if kind == "raised":
            text = f"node {node!r} raised {exc}: {message}"
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
        for key in ("mro", "traceback", "exit_code"):
            if e.get(key) is not None and e.get(key) != "":
                details[key] = e[key]
        return NodeError(text, node=node, **details)

    def value(self, node: str) -> Mapping[str, Any] | Goto | None:
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

    def send(self, msg: Mapping[str, Any] | bytes) -> None:
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

    async def call(self, call_path: str, state: Mapping[str, Any], ctx: ChildContext, *,
                   timeout: float | None, memory: int | None = None,
                   on_tokens: Callable[[int], None] | None = None,
                   effects: Effects | None = None) -> ChildResult:
        """Run ``call_path`` (``module:function``) on ``state`` in a worker process.

        ``timeout`` (seconds) bounds the call once the worker has it: past it the
        worker's process group is killed and reaped and ``TimeoutError`` is raised. A
        cancelled caller gets the same kill, then ``CancelledError``. ``memory``
        (bytes) runs the call in a fresh worker limited to that much address space.
        ``on_tokens(n)`` is called for every ``ctx.record_tokens(n)`` as it happens;
        what it raises is raised inside the node. ``effects`` backs ``ctx.once``.
        Every other failure -- of the node or of its worker -- is returned in
        ``ChildResult.error``; besides TimeoutError and CancelledError, `call` raises only
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
                raise TimeoutError(f"node {ctx.node!r} timed out after {timeout:g}s; its worker "
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
        args = [sys.executable, *_interpreter_flags(), "-m", "interlock._isolation",
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


__all__ = ["ChildContext", "ChildResult", "Effects", "IsolatedContext", "ProcessPool"]
