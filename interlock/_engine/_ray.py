"""Node bodies on Ray (``executor: ray``): where the body runs, nothing else.

The log, the fold, every edge decision, retries and budgets stay in the process that
executes the run; only the node's function goes to the cluster, with the state it
reads, and its update (or goto) comes back. `OnRay` is the innermost guard of such a
node (`_call.NodeCall` composes it in place of `in_thread`/`in_loop`):

- **Where.** The cluster at ``RAY_ADDRESS``; without it, the Ray of this process if the
  application started one (``ray.init``), else a local Ray started on first use (one
  per process, as ``ray.init()`` does). Ray is imported only then.
- **How.** A sync function is a Ray task (``max_retries=0``: the engine retries, and
  logs every attempt); an ``async def`` one is a method call on an async actor (Ray
  refuses async tasks), one actor per set of ``resources``. The function travels
  pickled (by reference if it is importable, by value otherwise -- Ray's cloudpickle)
  and is loaded on the worker in the engine's working directory (where the machine has
  it), with it and the engine's ``sys.path`` entries on the worker's path, so that a
  workflow's ``module:function`` imports there as it does here (on a machine of its
  own, a cluster worker needs the code installed, or shipped with a Ray
  ``runtime_env``).
- **Timeouts and cancellation** stop the task for real: ``ray.cancel(force=True)``
  kills a task's worker process; an actor call is cancelled (its coroutine gets
  ``CancelledError``, as an ``async def`` node in-process does).
- **Errors** keep their type: the exception the function raised (Ray's
  ``RayTaskError.cause``) is the node's error, its remote traceback added as a note, so
  ``retry.errors`` and ``on_error`` match it by class as they would in-process; the line
  of the user's code it came from is found on the worker (`_origin.carry`) and named in
  the node's error as for a node in-process (``(at nodes.py:8 in helper)``). A worker
  or actor that died (``WorkerCrashedError``, ``ActorDiedError``...) is the node's error,
  retried like any other.
- **ctx** on Ray: `RayContext` -- ``run_id``, ``node``, ``visit``, ``attempt``,
  ``idempotency_key``, ``item_index``, ``config``, ``args``; ``record_tokens(n)`` adds
  to the attempt's count, charged to the budgets when the call returns (the run cannot
  be reached from the cluster while the body runs); ``ctx.once`` is refused with a
  message (its journal lives in the run's process).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sys
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .._errors import NodeTimeout
from .._extras import install_hint
from .._json import JSONObject
from ._isolation import ChildContext, IsolatedContext
from ._origin import carry

if TYPE_CHECKING:
    from ._guards import Attempt

RAY_EXTRA = install_hint("ray")

_init_lock = threading.Lock()
_actors: dict[tuple[tuple[str, Any], ...], Any] = {}


def ray_module() -> Any:
    """``ray``, imported; an ImportError that says how to install it otherwise."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError(f"executor: ray needs Ray installed ({RAY_EXTRA}): {exc}") from None
    return ray


def _connect() -> Any:
    """Ray, connected: to ``RAY_ADDRESS``, the application's, or a local one (blocking:
    called on a thread)."""
    ray = ray_module()
    with _init_lock:
        if not ray.is_initialized():
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no phoning home
            _actors.clear()  # of a Ray shut down since: their handles are dead
            ray.init(address=os.environ.get("RAY_ADDRESS") or None,
                     include_dashboard=False, ignore_reinit_error=True)
    return ray


class RayContext(IsolatedContext):
    """The ``ctx`` of a node body on Ray (see the module's text): an isolated node's,
    but nothing goes back to the engine while the body runs."""

    __slots__ = ()

    def __init__(self, data: Mapping[str, object]) -> None:
        super().__init__(None, data)  # type: ignore[arg-type]  # no channel to the engine

    def record_tokens(self, n: int) -> None:
        """Count ``n`` tokens for this attempt; they are charged to the node's and the
        run's budgets when the body returns."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"record_tokens takes a non-negative int, got {n!r}")
        self._check_live()
        self._tokens += n

    async def once(self, key: str, fn: Callable[..., object], *args: Any) -> Any:
        raise RuntimeError(
            f"node {self.node!r} runs on Ray (executor: ray), where ctx.once cannot reach "
            "the run's effect journal; do the side effect in a node that runs in the "
            "engine's process, or make it idempotent with ctx.idempotency_key")

    def __repr__(self) -> str:
        return (f"<RayContext run={self.run_id} node={self.node} visit={self.visit} "
                f"attempt={self.attempt} pid={os.getpid()}>")


def _on_path(cwd: str, path: list[str]) -> None:
    """Work in the engine's working directory, if this machine has it (relative paths
    mean what they mean in-process), and put it and the engine's ``sys.path`` entries on
    this worker's path (missing ones, first), so that the node's module imports here."""
    if os.path.isdir(cwd) and os.getcwd() != cwd:
        os.chdir(cwd)
    missing = [p for p in [cwd, *path] if p and p not in sys.path and os.path.isdir(p)]
    sys.path[:0] = missing


def _prepare(fn_bytes: bytes, ctx_data: Mapping[str, object] | None, cwd: str,
             path: list[str]) -> tuple[Callable[..., Any], RayContext | None]:
    import ray.cloudpickle as cloudpickle

    _on_path(cwd, path)
    fn = cloudpickle.loads(fn_bytes)
    return fn, RayContext(ctx_data) if ctx_data is not None else None


def call_sync(fn_bytes: bytes, state: JSONObject, ctx_data: Mapping[str, object] | None,
              cwd: str, path: list[str]) -> tuple[Any, int]:
    """On a Ray worker: the node's sync function; its result and the tokens it recorded."""
    fn, ctx = _prepare(fn_bytes, ctx_data, cwd, path)
    try:
        value = fn(state, ctx) if ctx is not None else fn(state)
    except Exception as exc:
        carry(exc)  # (its traceback stays here: the line it came from goes with it)
        raise
    return value, ctx.tokens if ctx is not None else 0


class AsyncBodies:
    """On Ray, as an async actor: the ``async def`` node bodies (many at once)."""

    async def call(self, fn_bytes: bytes, state: JSONObject,
                   ctx_data: Mapping[str, object] | None, cwd: str, path: list[str]
                   ) -> tuple[Any, int]:
        fn, ctx = _prepare(fn_bytes, ctx_data, cwd, path)
        try:
            value = await (fn(state, ctx) if ctx is not None else fn(state))
        except Exception as exc:
            carry(exc)
            raise
        return value, ctx.tokens if ctx is not None else 0


class OnRay:
    """The body of an ``executor: ray`` node, under its timeout (see the module's text).
    Raises NodeTimeout, or the exception the body (or Ray) raised."""

    __slots__ = ("_pickled",)

    def __init__(self) -> None:
        self._pickled: dict[int, bytes] = {}  # each function pickled once per run

    async def __call__(self, a: Attempt) -> object:
        pn, ctx = a.pn, a.ctx
        fn = pn.fn
        assert fn is not None, "approval and agent nodes are not dispatched here"
        ray = await asyncio.to_thread(_connect) if not _connected() else ray_module()
        blob = self._pickled.get(id(fn))
        if blob is None:
            import ray.cloudpickle as cloudpickle

            blob = self._pickled[id(fn)] = cloudpickle.dumps(fn)  # type: ignore[no-untyped-call]
        ctx_data = ChildContext.of(ctx).to_json() if ctx is not None and pn.wants_ctx else None
        args = (blob, a.state, ctx_data, os.getcwd(), list(sys.path))
        options = pn.spec.resources.options() if pn.spec.resources is not None else {}
        actor = None
        if pn.is_async:
            actor = _actor(ray, options)
            ref = actor.call.remote(*args)
        else:
            ref = ray.remote(call_sync).options(max_retries=0, **options).remote(*args)
        # from the submission: the first Ray node of a process may wait seconds for Ray
        scope = asyncio.timeout(pn.timeout)
        try:
            async with scope:
                value, tokens = await ref
        except TimeoutError:
            _cancel(ray, ref, actor)
            if scope.expired():
                raise NodeTimeout() from None
            raise
        except asyncio.CancelledError:
            _cancel(ray, ref, actor)
            raise
        except ray.exceptions.RayTaskError as exc:
            raise _cause(exc) from None
        except ray.exceptions.RayActorError:
            _actors.pop(_key(options), None)  # a dead actor: the next call makes another
            raise
        if tokens and ctx is not None:
            ctx.record_tokens(tokens)
        return value


def _connected() -> bool:
    ray = sys.modules.get("ray")
    return ray is not None and bool(ray.is_initialized())


def _key(options: Mapping[str, object]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(options.items()))


def _actor(ray: Any, options: Mapping[str, object]) -> Any:
    key = _key(options)
    actor = _actors.get(key)
    if actor is None:
        actor = _actors[key] = ray.remote(AsyncBodies).options(
            max_concurrency=1000, max_restarts=0, **options).remote()
    return actor


def _cancel(ray: Any, ref: Any, actor: Any) -> None:
    """Stop the task for real: kill a task's worker; cancel an actor's call."""
    with contextlib.suppress(Exception):  # it ended meanwhile: nothing left to stop
        ray.cancel(ref, force=actor is None)


def _cause(exc: Any) -> BaseException:
    """The exception the body raised on Ray, with its remote traceback as a note."""
    cause = getattr(exc, "cause", None)
    if not isinstance(cause, BaseException):
        return exc  # type: ignore[no-any-return]
    remote = _ANSI.sub("", str(exc))  # "ray::fn() (pid=…, ip=…)" and the remote traceback
    if remote:
        cause.add_note(f"(raised on Ray) {remote[-3000:]}")
    return cause


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


__all__ = ["RAY_EXTRA", "AsyncBodies", "OnRay", "RayContext", "call_sync", "ray_module"]
