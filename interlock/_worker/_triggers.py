"""Triggers: what starts runs of a workflow by itself, and the ids those runs get.

A trigger's run id is derived from the workflow, the trigger and its slot (a schedule's
or an interval's time) or the key a poll function returned, so any number of processes
firing the same slot start exactly one run: the store refuses a second run with that id
(`RunExists`), which the firer takes for "fired already". A slot counts as fired once its
run exists: one whose start fails (the store is down) is tried again every tick while it
is within `GRACE`. Nothing else is shared; the store keeps the runs and the polls'
cursors.

- ``{schedule: CRON, input}``: cron in UTC (croniter), five fields, or six with the
  seconds first. The slot is the schedule's latest time at or before now.
- ``{every: 30s, input}``: the slots are the multiples of the interval since the Unix
  epoch (so every process agrees on them, whenever it started).
- ``{poll: module:function, every: 30s}``: each slot, ``function(ctx)`` (sync or async;
  ``ctx.config``, ``ctx.cursor``, ``ctx.workflow``) returns new items as ``[{key,
  input}]``, or ``{"items": [...], "cursor": ...}``; one run starts per key not started
  yet. The cursor is kept in the store (`Store.get_cursor`, under the trigger's run
  prefix), so every process firing the trigger, and one restarted, goes on from the
  latest; it moves on only once every item's run exists (the keys make starting one
  twice impossible). Without a store (`Firer`'s ``store`` None), in the firing process.

*Decisions* (where the contract is silent): a slot is fired only while it is at most
`GRACE` seconds old, so a process started (or a worker back from an outage) fires the
current slot if it is due, not every slot it missed -- as cron does, not as anacron
does. A poll function that raises is logged and called again at its next slot; it never
stops the firer. The runs' ids: ``WORKFLOW.trigger-ID.20261201T001500Z`` (a slot, UTC),
``WORKFLOW.trigger-ID.KEY`` (a poll's key, or a digest of it when it is not a plain
word); ``ID`` is the trigger's ``id:`` or a digest of its definition.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import inspect
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import orjson

from .._definition._callables import import_callable
from .._definition._model import TriggerSpec, WorkflowSpec
from .._errors import InterlockError, RunExists
from .._json import JSONObject
from .._store import Store

if TYPE_CHECKING:
    from croniter import croniter

log = logging.getLogger("interlock.triggers")

GRACE = 60.0  # seconds a slot may be late and still be fired
_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_.:-]{1,80}$")

#: ``start(workflow, run_id, input)``: start the run (or record it PENDING); raises
#: `RunExists` when a run with that id exists (it was fired already)
Start = Callable[[str, str, JSONObject], Awaitable[object]]


class NotFired(InterlockError):
    """What `Start` raises when it refuses a slot for good -- the run would fail for a
    reason no retry changes (an agent without its API key where the run would execute):
    logged once and the slot counted as fired; a poll's cursor stays, so its items are
    offered again at its next slot."""


def trigger_id(trigger: TriggerSpec) -> str:
    """The trigger's ``id:``, or a digest of its definition (stable when triggers are
    reordered; a changed trigger is a new one)."""
    if trigger.id is not None:
        return trigger.id
    data = trigger.model_dump(mode="json", exclude_defaults=True, exclude={"description"})
    return hashlib.sha256(orjson.dumps(data, option=orjson.OPT_SORT_KEYS)).hexdigest()[:8]


_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]")


def run_prefix(workflow: str, trigger: TriggerSpec) -> str:
    """The trigger's runs' id prefix: the workflow's name (as the run-id grammar allows
    it: other characters as ``-``, at most 64 of them) and the trigger's id."""
    name = _ID_UNSAFE.sub("-", workflow)[:64]
    if not name[:1].isalnum() or not name[:1].isascii():
        name = "w" + name[:63]
    return f"{name}.trigger-{trigger_id(trigger)}."


def slot_run_id(workflow: str, trigger: TriggerSpec, slot: float) -> str:
    stamp = dt.datetime.fromtimestamp(slot, dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    return run_prefix(workflow, trigger) + stamp


def key_run_id(workflow: str, trigger: TriggerSpec, key: str) -> str:
    prefix = run_prefix(workflow, trigger)
    plain = key if _PLAIN_KEY.match(key) and len(prefix) + len(key) <= 128 else \
        "k" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]
    return prefix + plain


def _cron(expr: str, at: float) -> croniter:
    from croniter import croniter

    return croniter(expr, at, second_at_beginning=len(expr.split()) == 6)


def check_schedule(expr: str) -> str | None:
    """What is wrong with a cron expression, or None."""
    from croniter import CroniterError

    try:
        _cron(expr, 0.0).get_next(float)
    except (CroniterError, ValueError) as exc:
        return str(exc)
    return None


def last_slot(trigger: TriggerSpec, now: float) -> float:
    """The trigger's latest slot at or before ``now`` (a poll's: its interval's)."""
    if trigger.schedule is not None:
        return float(_cron(trigger.schedule, now + 1e-3).get_prev(float))
    assert trigger.every is not None
    return math.floor(now / trigger.every) * trigger.every


def next_slot(trigger: TriggerSpec, now: float) -> float:
    """The trigger's first slot after ``now``."""
    if trigger.schedule is not None:
        return float(_cron(trigger.schedule, now).get_next(float))
    assert trigger.every is not None
    return (math.floor(now / trigger.every) + 1) * trigger.every


@dataclass(slots=True)
class PollContext:
    """The ``ctx`` of a poll function."""

    workflow: str
    config: Mapping[str, Any]
    cursor: Any = None


@dataclass(slots=True)
class _State:
    fired: float | None = None  # the latest slot this process fired (or found fired)
    cursor: object = None  # the poll's cursor, where the store cannot keep it


@dataclass
class Firer:
    """Fires the triggers of ``workflows`` (name -> spec) through ``start``; `tick` does
    what is due at a time, `run` ticks until ``stop`` is set. ``store``: where poll
    triggers' cursors are kept (`Store.get_cursor`), shared by every process firing
    them; None: in this process only."""

    workflows: Mapping[str, WorkflowSpec]
    start: Start
    store: Store | None = None
    _state: dict[tuple[str, str], _State] = field(default_factory=dict, init=False)

    @property
    def triggers(self) -> list[tuple[str, TriggerSpec]]:
        return [(name, t) for name, spec in self.workflows.items() for t in spec.triggers]

    async def tick(self, now: float) -> list[str]:
        """Fire what is due at ``now``; the ids of the runs this call started.

        A slot is marked fired once its run exists (started here, or found started); a
        slot whose start fails (the store is down) is tried again at the next tick, for
        as long as it is within `GRACE`. A poll's cursor moves on once every item's run
        exists. An error is logged per trigger; the others are fired all the same. A
        start refused for good (`NotFired`) is logged and its slot counted as fired."""
        started: list[str] = []
        for name, trigger in self.triggers:
            st = self._state.setdefault((name, trigger_id(trigger)), _State())
            slot = last_slot(trigger, now)
            if (st.fired is not None and slot <= st.fired) or now - slot > GRACE:
                continue
            try:
                if trigger.poll is None:
                    rid = slot_run_id(name, trigger, slot)
                    if await self._start(name, rid, dict(trigger.input or {})):
                        started.append(rid)
                else:
                    started += await self._poll(name, trigger, st)
            except NotFired as exc:  # refused: said once, not tried again every tick
                log.error("trigger %s of workflow %s: its slot %s was not fired: %s",
                          trigger_id(trigger), name, _utc(slot), exc)
            except Exception as exc:  # (a store error, mostly: the slot is tried again)
                left = int(GRACE - (now - slot))
                log.error("trigger %s of workflow %s: firing its slot %s failed (%s); "
                          "tried again at the next tick, for %ds more", trigger_id(trigger),
                          name, _utc(slot), exc if isinstance(exc, InterlockError)
                          else f"{type(exc).__name__}: {exc}", left,
                          exc_info=not isinstance(exc, InterlockError))
                continue
            st.fired = slot
        return started

    async def run(self, stop: asyncio.Event, interval: float = 1.0) -> None:
        """Tick every ``interval`` seconds until ``stop`` is set (at most ``interval``
        late for a slot)."""
        while not stop.is_set():
            try:
                await self.tick(time.time())
            except Exception:  # (tick logs its triggers' errors: a bug's, here)
                log.exception("firing triggers failed; trying again in %ss", interval)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)

    async def _start(self, workflow: str, run_id: str, data: JSONObject) -> bool:
        try:
            await self.start(workflow, run_id, data)
        except RunExists:
            return False  # another process fired it first
        log.info("trigger started run %s (workflow %s)", run_id, workflow)
        return True

    async def _cursor(self, workflow: str, trigger: TriggerSpec, st: _State) -> object:
        """The poll's cursor: the store's (every process's latest), else this process's."""
        if self.store is None:
            return st.cursor
        text = await self.store.get_cursor(cursor_name(workflow, trigger))
        return st.cursor if text is None else orjson.loads(text)

    async def _keep_cursor(self, workflow: str, trigger: TriggerSpec, st: _State,
                           cursor: object) -> None:
        st.cursor = cursor
        if self.store is None:
            return
        try:
            text = orjson.dumps(cursor).decode()
        except TypeError as exc:  # kept in this process only
            log.error("poll trigger %s of workflow %s returned a cursor that is not JSON "
                      "(%s); it is kept in this process only, and a restarted process "
                      "starts again from None", trigger.poll, workflow, exc)
            return
        await self.store.set_cursor(cursor_name(workflow, trigger), text)

    async def _poll(self, workflow: str, trigger: TriggerSpec, st: _State) -> list[str]:
        assert trigger.poll is not None
        cursor = await self._cursor(workflow, trigger, st)
        ctx = PollContext(workflow, dict(self.workflows[workflow].config), cursor)
        try:
            fn = import_callable(trigger.poll)
            got = fn(ctx)
            if inspect.isawaitable(got):
                got = await got
            items, cursor = _poll_result(trigger.poll, got, cursor)
        except Exception:
            log.exception("poll trigger %s of workflow %s failed; it is called again at its "
                          "next slot", trigger.poll, workflow)
            return []
        started = []
        for key, data in items:  # (an error here: the cursor stays, the slot is retried)
            rid = key_run_id(workflow, trigger, key)
            if await self._start(workflow, rid, data):
                started.append(rid)
        await self._keep_cursor(workflow, trigger, st, cursor)
        return started


def cursor_name(workflow: str, trigger: TriggerSpec) -> str:
    """The name a poll trigger's cursor is kept under in the store."""
    return run_prefix(workflow, trigger).rstrip(".")


def _utc(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _poll_result(path: str, got: object, cursor: object
                 ) -> tuple[list[tuple[str, JSONObject]], object]:
    """A poll function's items (key, input) and cursor, or a ValueError naming it."""
    if isinstance(got, Mapping):
        cursor = got.get("cursor", cursor)
        got = got.get("items", [])
    if got is None:
        return [], cursor
    if not isinstance(got, list | tuple):
        raise ValueError(f"poll function {path} returned {type(got).__name__}; it returns a "
                         "list of {key, input} (or {items: [...], cursor: ...})")
    items = []
    for item in got:
        if not isinstance(item, Mapping) or "key" not in item:
            raise ValueError(f"poll function {path} returned an item without a key: {item!r}; "
                             "each item is {key: 'unique-id', input: {...}}")
        data = item.get("input") or {}
        if not isinstance(data, Mapping):
            raise ValueError(f"poll function {path}: item {item['key']!r} has an input that "
                             "is not a mapping")
        items.append((str(item["key"]), dict(data)))
    return items, cursor


def describe(workflow: str, trigger: TriggerSpec, now: float) -> dict[str, Any]:
    """What ``interlock triggers`` shows of a trigger (its last run is the caller's)."""
    kind: Literal["schedule", "every", "poll"] = trigger.kind
    every = f"{trigger.every:g}s" if trigger.every is not None else ""
    what = (trigger.schedule if kind == "schedule" else
            f"{trigger.poll} every {every}" if kind == "poll" else every)
    nxt = next_slot(trigger, now)
    return {"workflow": workflow, "id": trigger_id(trigger), "kind": kind, "what": what,
            "input": trigger.input, "next": nxt,
            "next_utc": dt.datetime.fromtimestamp(nxt, dt.UTC).strftime("%Y-%m-%d %H:%M:%S"),
            "run_prefix": run_prefix(workflow, trigger)}


__all__ = ["GRACE", "Firer", "PollContext", "Start", "check_schedule", "cursor_name", "describe",
           "key_run_id", "last_slot", "next_slot", "run_prefix", "slot_run_id", "trigger_id"]
