"""Process isolation: run a node's body in a separate OS process (``isolation: process``).

The engine side is `ProcessPool`; a run's node call (`_call.NodeCall`) owns one (see
"Lifetime" below) and its `_guards.InProcess` calls
``await pool.call(call_path, state, ChildContext.of(ctx), timeout=..., memory=...)``
from the event loop (`_pool`). The worker side is `_worker`, run as
``python -m interlock._engine._isolation`` (`__main__`); `_protocol` is what both share.

Workers
-------
A worker is a fresh interpreter (``sys.executable -m interlock._engine._isolation``; fork+exec,
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
  reaped, then `call` **raises** ``NodeTimeout`` -- the runner's timeout path.
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
``NodeTimeout``, ``CancelledError``, and ``RuntimeError`` when the pool is closed.

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
One pool per run (`_call.NodeCall`, created on the first isolated call, closed when the run
stops): a pool's workers are asyncio subprocesses bound to the event loop that
started them, and ``Workflow.run_sync`` runs each run in a new loop, so a
process-wide pool would outlive its loop. A long-lived service that wants reuse
across runs can create one pool per loop and pass it in.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._pool import ChildContext, ChildResult, Effects, ProcessPool
    from ._worker import IsolatedContext

# Loaded on first use (PEP 562): ``python -m interlock._engine._isolation`` imports this package
# before it runs a worker's `__main__`, and a worker must not import the engine side
# (asyncio, subprocess...: start-up cost).
_WHERE = {"ChildContext": "_pool", "ChildResult": "_pool", "Effects": "_pool",
          "ProcessPool": "_pool", "IsolatedContext": "_worker"}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'interlock._engine._isolation' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = ["ChildContext", "ChildResult", "Effects", "IsolatedContext", "ProcessPool"]
