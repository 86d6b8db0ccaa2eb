"""Who wants to know that a run's log grew: the event streams.

`NotifyingStore` wraps the server's store and tells the `Hub` after every commit of a
run's records (the server's own executions), so a stream wakes at once; records that
other processes commit to the same store are found by `interlock.server._reads.Polls`
(woken by the store's change detector, `Store.wait_changed`: SQLite's ``data_version``,
PostgreSQL's ``LISTEN``; with `ServerOptions.poll` as the slow poll behind it).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
import weakref
from collections.abc import AsyncIterator, Iterator
from typing import Any

from interlock import Store
from interlock.support import Claim, Entry, LeaseRenewer, RunRow, Summary

# a stream's buffer of reply pieces: ``(seq, piece)``, ``seq`` the run's last committed
# record when the piece arrived
Pieces = collections.deque[tuple[int, dict[str, object]]]


class Hub:
    """One event per run with a waiter; set (and forgotten) when the run's log grows."""

    def __init__(self) -> None:
        # held by the waiters only: a run nobody waits for keeps no event here
        self._events: weakref.WeakValueDictionary[str, asyncio.Event] = \
            weakref.WeakValueDictionary()
        self.stopping = asyncio.Event()  # the server is shutting down: streams end
        # a conversation's reply as it streams: pieces not in the log, handed to each
        # event stream of the run that is open when they arrive, from the thread that
        # executes the run -- each tagged with the run's last seq this server committed
        # then, so a stream sends it only once it has sent the records up to that seq
        # (the records that came before it): a stream that reads the log late holds
        # the next model call's pieces too, and sends them after the previous call's
        # reply record, not before
        self._tokens: dict[str, list[Pieces]] = {}
        self._token_lock = threading.Lock()
        self._token_loop: asyncio.AbstractEventLoop | None = None
        # the runs this server executes with their replies streamed (`streaming`): their
        # last committed seq, and how many executions of each stream
        self._seqs: dict[str, int] = {}
        self._streamed: dict[str, int] = {}

    @contextlib.contextmanager
    def tokens(self, run_id: str) -> Iterator[Pieces]:
        """A buffer that gets the run's reply pieces while the block runs, each as
        ``(seq, piece)``: ``seq`` the run's last record committed before the piece."""
        buffer: Pieces = collections.deque()
        self._token_loop = asyncio.get_running_loop()
        with self._token_lock:
            self._tokens.setdefault(run_id, []).append(buffer)
        try:
            yield buffer
        finally:
            with self._token_lock:
                # (by identity: two streams' buffers holding the same pieces are equal)
                subscribers = [b for b in self._tokens.get(run_id, []) if b is not buffer]
                self._tokens[run_id] = subscribers
                if not subscribers:
                    self._tokens.pop(run_id, None)

    @contextlib.contextmanager
    def streaming(self, run_id: str) -> Iterator[None]:
        """While the block runs (an execution of the run whose replies stream, on any
        thread), the run's commits are counted (`committed`) to tag its pieces."""
        with self._token_lock:
            self._streamed[run_id] = self._streamed.get(run_id, 0) + 1
            self._seqs.setdefault(run_id, 0)
        try:
            yield
        finally:
            with self._token_lock:
                left = self._streamed.pop(run_id, 1) - 1
                if left:
                    self._streamed[run_id] = left
                else:
                    self._seqs.pop(run_id, None)

    def committed(self, run_id: str, seq: int) -> None:
        """The run's records up to ``seq`` are committed (by this process): streams wake."""
        self.mark(run_id, seq)
        self.changed(run_id)

    def mark(self, run_id: str, seq: int) -> None:
        """Remember ``seq`` as the run's last committed one, if its replies stream (from
        any thread, before the commit's next piece: the thread that made the commit)."""
        if run_id not in self._seqs:  # (the common case, without the lock)
            return
        with self._token_lock:
            if seq > self._seqs.get(run_id, seq):
                self._seqs[run_id] = seq

    def token(self, run_id: str, piece: dict[str, object]) -> None:
        """A piece of a reply (from any thread): to every open stream of the run, at once,
        tagged with the run's last committed seq; the streams are woken on the API's
        loop."""
        with self._token_lock:
            subscribers = self._tokens.get(run_id)
            if not subscribers:
                return
            tagged = (self._seqs.get(run_id, 0), piece)
            for buffer in subscribers:
                buffer.append(tagged)
        loop = self._token_loop
        if loop is None:
            return
        try:
            here = asyncio.get_running_loop() is loop
        except RuntimeError:
            here = False
        if here:
            self.changed(run_id)
        else:
            loop.call_soon_threadsafe(self.changed, run_id)

    def waiter(self, run_id: str) -> asyncio.Event:
        """An event set at the run's next commit (take it *before* reading the log)."""
        event = self._events.get(run_id)
        if event is None:
            event = self._events[run_id] = asyncio.Event()
        return event

    def changed(self, run_id: str) -> None:
        event = self._events.pop(run_id, None)
        if event is not None:
            event.set()

    async def wait(self, event: asyncio.Event, timeout: float) -> None:
        """Until ``event``, the server stopping, or ``timeout`` seconds."""
        stop = asyncio.ensure_future(self.stopping.wait())
        change = asyncio.ensure_future(event.wait())
        try:
            await asyncio.wait({stop, change}, timeout=timeout,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (stop, change):
                t.cancel()
            for t in (stop, change):
                with contextlib.suppress(asyncio.CancelledError):
                    await t


class NotifyingStore(Store):
    """``inner``, telling ``hub`` after each commit of a run's records."""

    def __init__(self, inner: Store, hub: Hub) -> None:
        self.inner, self.hub = inner, hub
        self.url = inner.url
        self.leases_in_writes = inner.leases_in_writes
        self.fences_appends = inner.fences_appends

    async def create_run(self, row: RunRow, entries: list[Entry]) -> None:
        await self.inner.create_run(row, entries)
        self.hub.committed(row.run_id, entries[-1].seq if entries else 0)

    async def append(self, run_id: str, entries: list[Entry], summary: Summary,
                     release: str | None = None, *, claim: Claim | None = None) -> None:
        if claim is None:
            await self.inner.append(run_id, entries, summary, release)
        else:
            await self.inner.append(run_id, entries, summary, release, claim=claim)
        self.hub.committed(run_id, summary.last_seq)

    async def wait_changed(self, timeout: float, seen: int | None = None,
                           run_id: str | None = None) -> int:
        return await self.inner.wait_changed(timeout, seen, run_id)

    async def wait_runnable(self, timeout: float) -> None:
        await self.inner.wait_runnable(timeout)

    async def get_run(self, run_id: str) -> RunRow:
        return await self.inner.get_run(run_id)

    async def entries(self, run_id: str, after: int = 0) -> list[Entry]:
        return await self.inner.entries(run_id, after)

    async def entries_page(self, run_id: str, after: int = 0, limit: int = 1000
                           ) -> list[Entry]:
        return await self.inner.entries_page(run_id, after, limit)

    async def iter_entries(self, run_id: str, after: int = 0, page: int = 1000
                           ) -> AsyncIterator[list[Entry]]:
        async for batch in self.inner.iter_entries(run_id, after, page):
            yield batch

    async def list_runs(self, *, status: str | None = None, workflow: str | None = None,
                        limit: int = 100) -> list[RunRow]:
        return await self.inner.list_runs(status=status, workflow=workflow, limit=limit)

    async def list_page(self, *, status: str | None = None, workflow: str | None = None,
                        limit: int = 100, before: tuple[float, str] | None = None,
                        updated_after: float | None = None) -> list[RunRow]:
        return await self.inner.list_page(status=status, workflow=workflow, limit=limit,
                                          before=before, updated_after=updated_after)

    async def leases(self) -> list[dict[str, Any]]:
        return await self.inner.leases()

    async def claim(self, run_id: str, owner: str, lease: float, *,
                    force: bool = False) -> int | None:
        return await self.inner.claim(run_id, owner, lease, force=force)

    async def heartbeat(self, run_id: str, owner: str, lease: float,
                        generation: int | None = None) -> None:
        if generation is None:
            await self.inner.heartbeat(run_id, owner, lease)
        else:
            await self.inner.heartbeat(run_id, owner, lease, generation)

    def lease_renewer(self) -> LeaseRenewer | None:
        return self.inner.lease_renewer()

    async def release(self, run_id: str, owner: str) -> None:
        await self.inner.release(run_id, owner)

    async def request_cancel(self, run_id: str, by: str | None) -> None:
        await self.inner.request_cancel(run_id, by)

    async def cancel_requested(self, run_id: str) -> dict[str, Any] | None:
        return await self.inner.cancel_requested(run_id)

    async def offer_decision(self, run_id: str, gate: str, decision: dict[str, Any]
                             ) -> dict[str, Any] | None:
        return await self.inner.offer_decision(run_id, gate, decision)

    async def decisions(self, run_id: str) -> dict[str, dict[str, Any]]:
        return await self.inner.decisions(run_id)

    async def save_snapshot(self, run_id: str, seq: int, data: bytes) -> None:
        await self.inner.save_snapshot(run_id, seq, data)

    async def load_snapshot(self, run_id: str) -> tuple[int, bytes] | None:
        return await self.inner.load_snapshot(run_id)

    async def delete_finished(self, run_ids: list[str]) -> tuple[list[str], int]:
        return await self.inner.delete_finished(run_ids)

    async def search_messages(self, workflow: str, query: str, *, limit: int = 5,
                              exclude: str | None = None) -> list[Any]:
        return await self.inner.search_messages(workflow, query, limit=limit, exclude=exclude)

    async def close(self) -> None:
        await self.inner.close()

    async def close_soon(self) -> None:
        await self.inner.close_soon()
