"""Test doubles for workflows that use interlock.

`ScriptedProvider` stands in for a model provider: it replays declared replies, one per
model call, in order -- offline, with no key, the same every run::

    from interlock.testing import ScriptedProvider

    wf.agent("risk", prompt="Plan: {{ plan }}", output=Risk, reads=["plan"],
             provider=ScriptedProvider([
                 {"tool_calls": [{"name": "lookup_control", "arguments": {"id": "C-7"}}]},
                 {"content": {"level": "HIGH", "reason": "no control"},
                  "usage": {"prompt_tokens": 120, "completion_tokens": 30}},
             ]))

The file form is ``provider: scripted`` with ``replies: [...]`` in the ``agent:`` block.
`scripted` gives a workflow file's agent nodes replies from the test itself -- no second
file::

    wf = scripted("workflow.yaml", {"risk": [{"content": {"level": "HIGH"}}]})

`FaultyStore` wraps any `Store` and makes chosen calls fail -- the Nth append, an append
holding a record of some type, a heartbeat, a read, every call for a while -- or takes
a run's lease away, to test what a workflow (and the engine) does when its store
fails::

    store = FaultyStore(open_store("memory://"))
    store.fail_append(holding="node.retrying")           # once, then the store is fine
    store.fail_for(3.0, "append", "heartbeat")           # an outage of 3 s
    store.fail_append(error=OSError(28, "No space left on device"), times=None)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ._errors import StoreError, UsageError
from ._json import JSONObject
from ._log import Entry
from ._store import Claim, LeaseRenewer, RunRow, Store, Summary
from .agents._providers import ScriptedProvider

if TYPE_CHECKING:
    from ._workflow import Workflow

_PROVIDER_KEYS = ("provider", "model", "base_url", "api_key_env", "replies")


def scripted(source: str | os.PathLike[str] | Mapping[str, Any],
             replies: Mapping[str, Sequence[Any]]) -> Workflow:
    """The workflow of ``source`` (a file, or a dict in the file's shape) with each agent
    node named in ``replies`` answered by ``provider: scripted`` with those replies (each
    as in a file: a string, ``{content, tool_calls, usage}``, or a list of one per item of
    a mapped node) instead of its own provider. The runs' stored definition says so."""
    from ._definition._spec import load_spec
    from ._workflow import load

    spec = load_spec(dict(source) if isinstance(source, Mapping) else source)
    data: dict[str, Any] = dict(spec.definition())
    nodes: dict[str, Any] = dict(data["nodes"])
    data["nodes"] = nodes
    for name, given in replies.items():
        node = nodes.get(name)
        if not isinstance(node, dict) or not isinstance(node.get("agent"), dict):
            agents = [n for n, ns in nodes.items() if isinstance(ns.get("agent"), dict)]
            raise UsageError(f"scripted(): {name!r} is not an agent node of workflow "
                             f"{spec.workflow!r} (its agent nodes: "
                             f"{', '.join(agents) or 'none'})")
        agent = {k: v for k, v in node["agent"].items() if k not in _PROVIDER_KEYS}
        nodes[name] = {**node, "agent": {**agent, "provider": "scripted",
                                         "replies": list(given)}}
    return load(data)


READS = ("get_run", "entries", "entries_page", "list_runs", "load_snapshot",
         "cancel_requested", "decisions")


class Fault:
    """One kind of failure a `FaultyStore` injects (made by `FaultyStore.fail`).

    It fails the calls of ``methods`` that match (``when(*args, **kwargs)``, if given),
    from the ``nth`` matching one on (1: the next), ``times`` of them (None: every one),
    while it is in force (``seconds`` from its making, if given). ``after``: the call
    is made first, then fails -- its answer lost, what a dropped connection after a
    commit looks like. ``hits`` counts the calls it failed; ``hit`` is set at the first
    (a ``heartbeat`` fault also fails the lease keeper's renewals, on its thread: ``hit``
    is then set on the event loop the fault was made on).
    """

    def __init__(self, methods: tuple[str, ...], *, nth: int = 1,
                 when: Callable[..., bool] | None = None, times: int | None = 1,
                 seconds: float | None = None, error: BaseException | None = None,
                 after: bool = False) -> None:
        self.methods = methods
        self.nth = nth
        self.when = when
        self.times = times
        self.until = time.monotonic() + seconds if seconds is not None else None
        self.error = error
        self.after = after
        self.matched = 0
        self.hits = 0
        self.hit = asyncio.Event()
        self._thread = threading.get_ident()
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None

    @property
    def spent(self) -> bool:
        """No call will fail through it any more."""
        return (self.times is not None and self.hits >= self.times) or \
            (self.until is not None and time.monotonic() >= self.until)

    def applies(self, method: str, args: tuple[object, ...], kwargs: dict[str, object]
                ) -> bool:
        if method not in self.methods or self.spent:
            return False
        if self.when is not None and not self.when(*args, **kwargs):
            return False
        self.matched += 1
        return self.matched >= self.nth

    def raise_for(self, method: str) -> None:
        self.hits += 1
        if threading.get_ident() == self._thread or self._loop is None:
            self.hit.set()
        else:  # (the lease keeper's thread: asyncio.Event is not thread-safe)
            with contextlib.suppress(RuntimeError):  # (its loop closed: nobody waits)
                self._loop.call_soon_threadsafe(self.hit.set)
        if self.error is not None:
            raise self.error
        raise StoreError(f"FaultyStore: {method} failed (an injected fault, hit "
                         f"{self.hits})")


class FaultyStore(Store):
    """A `Store` that forwards every call to ``inner`` -- except those a `Fault` fails.

    Every call goes through with its arguments as given (``*args, **kwargs``), so a
    store method or keyword argument added later still works. ``calls`` counts the
    calls of each method. It fences appends when ``inner`` does (`Store.fences_appends`):
    a claim returns its generation, appends are refused once another owner claimed the
    run (`lose_lease`), and leases are renewed by the lease keeper's thread through
    ``inner``'s renewer -- each renewal counted, and failed, as a ``heartbeat``.
    """

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.url = inner.url
        self.leases_in_writes = bool(getattr(inner, "leases_in_writes", False))
        self.fences_appends = bool(getattr(inner, "fences_appends", False))
        self._calls_lock = threading.Lock()  # (renewals count from the keeper's thread)
        self.faults: list[Fault] = []
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:  # what the Store interface does not name
        return getattr(self.inner, name)

    # -- faults ------------------------------------------------------------------------

    def fail(self, *methods: str, nth: int = 1, when: Callable[..., bool] | None = None,
             times: int | None = 1, seconds: float | None = None,
             error: BaseException | None = None, after: bool = False) -> Fault:
        """Fail calls of ``methods`` (see `Fault`); returns the fault (its ``hits``)."""
        fault = Fault(methods, nth=nth, when=when, times=times, seconds=seconds,
                      error=error, after=after)
        self.faults.append(fault)
        return fault

    def fail_append(self, nth: int = 1, *, holding: str | None = None,
                    when: Callable[[list[Entry]], bool] | None = None,
                    times: int | None = 1, error: BaseException | None = None,
                    after: bool = False) -> Fault:
        """Fail the ``nth`` append from now (of those holding a record of type
        ``holding``, or whose entries ``when`` accepts)."""
        def match(run_id: str, entries: list[Entry], *args: object, **kwargs: object) -> bool:
            if holding is not None and not any(e.type == holding for e in entries):
                return False
            return when is None or when(entries)
        return self.fail("append", nth=nth, when=match, times=times, error=error,
                         after=after)

    def fail_heartbeat(self, nth: int = 1, *, times: int | None = 1,
                       error: BaseException | None = None) -> Fault:
        return self.fail("heartbeat", nth=nth, times=times, error=error)

    def fail_reads(self, nth: int = 1, *, times: int | None = 1,
                   error: BaseException | None = None, methods: tuple[str, ...] = READS
                   ) -> Fault:
        return self.fail(*methods, nth=nth, times=times, error=error)

    def fail_for(self, seconds: float, *methods: str, error: BaseException | None = None
                 ) -> Fault:
        """Every call of ``methods`` (default: every write and read) fails for
        ``seconds`` from now: the store is down."""
        return self.fail(*(methods or (*_WRITES, *READS)), times=None, seconds=seconds,
                         error=error)

    async def lose_lease(self, run_id: str, owner: str = "faulty-store:another-owner",
                         lease: float = 60.0) -> None:
        """Another owner takes the run's claim (``force``): its executor's lease is lost."""
        await self.inner.claim(run_id, owner, lease, force=True)

    def heal(self) -> None:
        """No more faults."""
        self.faults.clear()

    def _fault(self, method: str, args: tuple[object, ...], kwargs: dict[str, object]
               ) -> Fault | None:
        """The fault that fails this call, if any (the call counted)."""
        with self._calls_lock:
            self.calls[method] += 1
            return next((f for f in list(self.faults) if f.applies(method, args, kwargs)),
                        None)

    async def _call(self, method: str, *args: object, **kwargs: object) -> Any:
        # Any: what the inner store's method returns, typed by the forwarding method
        fault = self._fault(method, args, kwargs)
        if fault is not None and not fault.after:
            fault.raise_for(method)
        result = await getattr(self.inner, method)(*args, **kwargs)
        if fault is not None:
            fault.raise_for(method)
        return result

    # -- the Store interface, forwarded ------------------------------------------------

    async def create_run(self, row: RunRow, entries: list[Entry], *args: object,
                         **kwargs: object) -> None:
        await self._call("create_run", row, entries, *args, **kwargs)

    async def append(self, run_id: str, entries: list[Entry], summary: Summary,
                     *args: object, **kwargs: object) -> None:
        await self._call("append", run_id, entries, summary, *args, **kwargs)

    async def get_run(self, run_id: str, *args: object, **kwargs: object) -> RunRow:
        row: RunRow = await self._call("get_run", run_id, *args, **kwargs)
        return row

    async def entries(self, run_id: str, *args: object, **kwargs: object) -> list[Entry]:
        got: list[Entry] = await self._call("entries", run_id, *args, **kwargs)
        return got

    async def entries_page(self, run_id: str, *args: object, **kwargs: object) -> list[Entry]:
        got: list[Entry] = await self._call("entries_page", run_id, *args, **kwargs)
        return got

    async def list_runs(self, *args: object, **kwargs: object) -> list[RunRow]:
        got: list[RunRow] = await self._call("list_runs", *args, **kwargs)
        return got

    async def claim(self, run_id: str, owner: str, lease: float, *args: object,
                    **kwargs: object) -> int | None:
        got: int | None = await self._call("claim", run_id, owner, lease, *args, **kwargs)
        return got

    async def claim_next(self, owner: str, lease: float, *args: object, **kwargs: object
                         ) -> str | None:
        got: str | None = await self._call("claim_next", owner, lease, *args, **kwargs)
        return got

    async def wait_runnable(self, *args: object, **kwargs: object) -> None:
        await self._call("wait_runnable", *args, **kwargs)

    async def heartbeat(self, run_id: str, owner: str, lease: float, *args: object,
                        **kwargs: object) -> None:
        await self._call("heartbeat", run_id, owner, lease, *args, **kwargs)

    def lease_renewer(self) -> LeaseRenewer | None:
        inner = self.inner.lease_renewer()
        return None if inner is None else _FaultyRenewer(self, inner)

    async def release(self, run_id: str, owner: str, *args: object, **kwargs: object) -> None:
        await self._call("release", run_id, owner, *args, **kwargs)

    async def request_cancel(self, run_id: str, *args: object, **kwargs: object) -> None:
        await self._call("request_cancel", run_id, *args, **kwargs)

    async def cancel_requested(self, run_id: str, *args: object, **kwargs: object
                               ) -> JSONObject | None:
        got: JSONObject | None = await self._call("cancel_requested", run_id, *args,
                                                      **kwargs)
        return got

    async def offer_decision(self, run_id: str, gate: str, decision: dict[str, Any],
                             *args: object, **kwargs: object) -> dict[str, Any] | None:
        got: dict[str, Any] | None = await self._call("offer_decision", run_id, gate,
                                                      decision, *args, **kwargs)
        return got

    async def decisions(self, run_id: str, *args: object, **kwargs: object
                        ) -> dict[str, dict[str, Any]]:
        got: dict[str, dict[str, Any]] = await self._call("decisions", run_id, *args,
                                                          **kwargs)
        return got

    async def save_snapshot(self, run_id: str, seq: int, data: bytes, *args: object,
                            **kwargs: object) -> None:
        await self._call("save_snapshot", run_id, seq, data, *args, **kwargs)

    async def load_snapshot(self, run_id: str, *args: object, **kwargs: object
                            ) -> tuple[int, bytes] | None:
        got: tuple[int, bytes] | None = await self._call("load_snapshot", run_id, *args,
                                                         **kwargs)
        return got

    async def delete_finished(self, run_ids: list[str], *args: object, **kwargs: object
                              ) -> tuple[list[str], int]:
        got: tuple[list[str], int] = await self._call("delete_finished", run_ids, *args,
                                                      **kwargs)
        return got

    async def size_bytes(self) -> int | None:
        got: int | None = await self._call("size_bytes")
        return got

    async def reclaim(self) -> None:
        await self._call("reclaim")

    async def close(self) -> None:
        await self.inner.close()

    async def close_soon(self) -> None:
        await self.inner.close_soon()


class _FaultyRenewer(LeaseRenewer):
    """The inner store's renewer, each renewal a ``heartbeat`` call of the `FaultyStore`
    (counted, and failed by its heartbeat faults) -- on the lease keeper's thread."""

    def __init__(self, store: FaultyStore, inner: LeaseRenewer) -> None:
        self.store, self.inner = store, inner

    def renew(self, run_id: str, claim: Claim, lease: float) -> None:
        args = (run_id, claim.owner, lease, claim.generation)
        fault = self.store._fault("heartbeat", args, {})
        if fault is not None and not fault.after:
            fault.raise_for("heartbeat")
        self.inner.renew(run_id, claim, lease)
        if fault is not None:
            fault.raise_for("heartbeat")

    def close(self) -> None:
        self.inner.close()


_WRITES = ("create_run", "append", "claim", "claim_next", "heartbeat", "release",
           "request_cancel", "save_snapshot", "delete_finished", "offer_decision")


__all__ = ["Fault", "FaultyStore", "ScriptedProvider"]
