"""The worker (child) side of `isolation: process`: what ``python -m interlock._engine._isolation``
runs (see `interlock._engine._isolation.__main__`).

Only the standard library and orjson: no pydantic, and no asyncio until the first async
node (it is the costliest import left) -- this runs on every cold start. The engine side
(`_pool`) is never imported in a worker.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from ._protocol import _TB_LIMIT, _clean, _encode, _size, _text

_RESERVE = 4 << 20  # bytes set aside under a memory limit, freed to report a MemoryError
_MAIN: dict[str, Any] = {}  # the engine's __main__: {"name": ..., "file": ...}


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

    def ask(self, msg: Mapping[str, object]) -> dict[str, Any]:
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


def _exception_from(reply: Mapping[str, object]) -> Exception:
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

    __slots__ = ("_chan", "_live", "_tokens", "args", "attempt", "config", "idempotency_key",
                 "item_index", "node", "run_id", "visit")

    def __init__(self, chan: _Channel, data: Mapping[str, Any]) -> None:
        self._chan = chan
        self._live = True
        self._tokens = 0
        self.run_id: str = data["run_id"]
        self.node: str = data["node"]
        self.visit: int = data["visit"]
        self.attempt: int = data["attempt"]
        self.idempotency_key: str = data["idempotency_key"]
        self.item_index: int | None = data.get("item_index")  # a mapped node's item
        self.config: Mapping[str, object] = data.get("config") or {}
        self.args: Mapping[str, object] = data.get("args") or {}

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

    async def once(self, key: str, fn: Callable[..., object], *args: Any) -> Any:
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


def _resolve(path: str, cache: dict[str, tuple[Callable[..., object], bool]]
             ) -> tuple[Callable[..., object], bool]:
    """``module:attr.attr`` -> (function, wants ctx), resolved as `_callables.import_callable`
    does (the engine's side), with a worker's own rules for ``__main__`` and new files."""
    hit = cache.get(path)
    if hit is not None:
        return hit
    import importlib

    from ..._definition._callables import callable_at, import_module

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
        obj = import_module(module_name)
    fn = callable_at(obj, path)
    from ..._definition._signature import param_count

    entry = (fn, param_count(fn) >= 2)
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
            path = ["", *path]  # the working directory is importable (as import_callable makes it)
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


def _invoke(fn: Callable[..., object], wants_ctx: bool, state: Any, ctx: IsolatedContext) -> Any:
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


def _error_reply(exc: BaseException, kind: str, t0: float) -> bytes:
    try:
        tb = _format_tb(exc)
    except Exception:
        tb = ""
    error = {"exception": type(exc).__name__, "message": _text(exc), "traceback": tb,
             "mro": [c.__name__ for c in type(exc).__mro__], "kind": kind}
    try:
        from .._origin import user_frame

        at = user_frame(exc)  # where in the user's code (the engine adds it to the line)
    except Exception:
        at = None
    if at:
        error["at"] = at
    return _encode({"t": "error", "error": error, "ms": (time.perf_counter() - t0) * 1000})


def _result_reply(result: Any, t0: float) -> bytes:
    goto: str | None = None
    update = result
    ctx_module = sys.modules.get("interlock._engine._context")  # loaded if the node used goto()
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
              cache: dict[str, tuple[Callable[..., object], bool]],
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
    cache: dict[str, tuple[Callable[..., object], bool]] = {}
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
    """``python -m interlock._engine._isolation --parent PID [--memory BYTES] [--crash-fd FD]``."""
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
