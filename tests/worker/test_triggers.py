"""Triggers (SPEC §9): schedules, intervals and polls; one run per slot or key however
many processes fire it (real processes racing on one SQLite file); `interlock triggers`;
and what `validate` refuses."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import interlock
from interlock._definition._model import TriggerSpec
from interlock._worker._triggers import (
    GRACE,
    Firer,
    key_run_id,
    last_slot,
    next_slot,
    slot_run_id,
    trigger_id,
)

if TYPE_CHECKING:
    from conftest import CliProject

NODES = '''
from pathlib import Path

def hello(s):
    return {"said": f"hello {s['who']}"}

def source(ctx):
    n = ctx.cursor or 0
    if Path("poll.fails").exists():
        Path("poll.fails").unlink()
        raise ConnectionError("the error tracker is down")
    # the newest two errors each time: one new, one already seen
    return {"items": [{"key": f"err-{k}", "input": {"who": f"e{k}"}} for k in (n, n + 1)],
            "cursor": n + 1}
'''

WORKFLOW = """
workflow: greeter
input: [who]
nodes:
  hello: {mod}:hello
edges:
  - {from: START, to: hello}
triggers:
  - {schedule: '*/15 * * * *', input: {who: cron}}
  - {every: 30s, input: {who: interval}, id: half-minute}
  - {poll: '{mod}:source', every: 1m}
"""

T0 = dt.datetime(2026, 12, 1, 10, 15, 0, tzinfo=dt.UTC).timestamp()


@pytest.fixture
def project(make_project: Callable[..., CliProject]) -> CliProject:
    p = make_project(NODES, prefix="trig")
    p.workflow(WORKFLOW, "greeter.yaml")
    return p


def firer_for(p: CliProject) -> tuple[Firer, interlock.Workflow]:
    wf = interlock.load("greeter.yaml")

    async def start(workflow: str, run_id: str, data: dict[str, Any]) -> Any:
        assert workflow == "greeter"
        return await wf.run(data, store=p.store, run_id=run_id)

    return Firer({"greeter": wf.spec}, start), wf


def test_slots_are_the_schedules_times_and_the_intervals_multiples() -> None:
    cron = TriggerSpec(schedule="*/15 * * * *")
    assert last_slot(cron, T0) == T0  # a slot fires at its own time
    assert last_slot(cron, T0 + 899) == T0 and next_slot(cron, T0) == T0 + 900
    seconds = TriggerSpec(schedule="30 */15 * * * *")  # six fields: seconds first
    assert last_slot(seconds, T0 + 40) == T0 + 30
    every = TriggerSpec(every="30s")
    assert last_slot(every, T0 + 29.9) == T0 and next_slot(every, T0 + 29.9) == T0 + 30
    assert slot_run_id("greeter", every, T0) == \
        f"greeter.trigger-{trigger_id(every)}.20261201T101500Z"
    # a trigger's id is its own, or a digest of what it is (not of its place in the list)
    assert trigger_id(TriggerSpec(every="30s", id="half")) == "half"
    assert trigger_id(TriggerSpec(every="30s")) == trigger_id(TriggerSpec(every=30))
    assert trigger_id(TriggerSpec(every="30s")) != trigger_id(TriggerSpec(every="31s"))
    weird = key_run_id("greeter", every, "ERR 42/ü")
    assert weird.startswith(f"greeter.trigger-{trigger_id(every)}.k") and " " not in weird


def test_a_due_slot_starts_one_run_and_firing_it_again_starts_none(
        project: CliProject) -> None:
    firer, _ = firer_for(project)
    started = asyncio.run(firer.tick(T0 + 5))
    cron, every = (f"greeter.trigger-{trigger_id(t)}." for t in firer.workflows["greeter"]
                   .triggers[:2])
    assert sorted(started) == sorted([cron + "20261201T101500Z", every + "20261201T101500Z",
                                      key_run_id("greeter", firer.workflows["greeter"]
                                                 .triggers[2], "err-0"),
                                      key_run_id("greeter", firer.workflows["greeter"]
                                                 .triggers[2], "err-1")])
    result = asyncio.run(interlock.status(cron + "20261201T101500Z", store=project.store))
    assert result.status == "COMPLETED" and result.state["said"] == "hello cron"
    assert asyncio.run(firer.tick(T0 + 6)) == []  # the same slots: nothing new
    # another process firing the same slots: the store refuses the runs' ids
    other, _ = firer_for(project)
    assert asyncio.run(other.tick(T0 + 7)) == []
    assert len(asyncio.run(interlock.list_runs(store=project.store))) == 4


def test_a_slot_older_than_the_grace_is_not_fired(project: CliProject) -> None:
    """A process started long after a slot (or back from an outage) does not fire it:
    as cron, not as anacron."""
    firer, _ = firer_for(project)
    cron = firer.workflows["greeter"].triggers[0]
    at = T0 + 14 * 60  # 10:29:00: the schedule's last slot (10:15) is 14 minutes old
    assert GRACE < 14 * 60
    started = asyncio.run(firer.tick(at))
    assert "greeter.trigger-half-minute.20261201T102900Z" in started  # due now
    assert not [r for r in started if r.startswith(f"greeter.trigger-{trigger_id(cron)}.")]
    later = asyncio.run(firer.tick(T0 + 15 * 60 + 1))  # 10:30:01: the schedule's next slot
    assert slot_run_id("greeter", cron, T0 + 15 * 60) in later


def test_a_poll_starts_one_run_per_new_key_and_survives_its_own_failure(
        project: CliProject) -> None:
    firer, _ = firer_for(project)
    poll = firer.workflows["greeter"].triggers[2]
    first = [r for r in asyncio.run(firer.tick(T0)) if ".trigger-" + trigger_id(poll) in r]
    assert first == [key_run_id("greeter", poll, "err-0"), key_run_id("greeter", poll, "err-1")]
    Path("poll.fails").write_text("")
    failed = asyncio.run(firer.tick(T0 + 60))
    assert not [r for r in failed if "err-" in r]  # it raised: logged, nothing started
    # the next slot: the cursor went on from the last good call (1): err-1 seen, err-2 new
    again = [r for r in asyncio.run(firer.tick(T0 + 120)) if "err-" in r]
    assert again == [key_run_id("greeter", poll, "err-2")]
    result = asyncio.run(interlock.status(key_run_id("greeter", poll, "err-2"),
                                         store=project.store))
    assert result.state["said"] == "hello e2"


RACER = '''
import asyncio, json, sys, time
import interlock
from interlock._worker._triggers import Firer

wf = interlock.load("greeter.yaml")
store = sys.argv[1]

async def start(workflow, run_id, data):
    return await wf.run(data, store=store, run_id=run_id)

async def main():
    firer = Firer({"greeter": wf.spec}, start)
    print("ready", flush=True)  # loaded: the window opens when all three are
    until = float(sys.stdin.readline())
    started = []
    while time.time() < until:
        started += await firer.tick(time.time())
        await asyncio.sleep(0.05)
    print(json.dumps(started))

asyncio.run(main())
'''


def test_processes_firing_the_same_slots_start_each_once(project: CliProject) -> None:
    import time

    project.workflow("""
    workflow: greeter
    input: [who]
    nodes:
      hello: {mod}:hello
    edges:
      - {from: START, to: hello}
    triggers:
      - {every: 1s, input: {who: racer}}
    """, "greeter.yaml")
    Path("racer.py").write_text(textwrap.dedent(RACER))
    procs = [subprocess.Popen([sys.executable, "racer.py", project.store],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for _ in range(3)]
    # the four-second window opens once every process has loaded (a slow start under load
    # would otherwise eat the window, and fewer slots than the assertion expects would fire)
    for p in procs:
        assert p.stdout is not None and p.stdout.readline() == "ready\n"
    until = time.time() + 4
    for p in procs:
        assert p.stdin is not None
        p.stdin.write(f"{until}\n")
        p.stdin.flush()
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    started = [json.loads(out) for out in outs]
    fired = [rid for s in started for rid in s]
    assert len(fired) == len(set(fired)), "a slot was started by two processes"
    stored = {r.run_id for r in asyncio.run(interlock.list_runs(store=project.store))}
    assert stored == set(fired) and len(stored) >= 3  # ~4 one-second slots, each once
    for rid in stored:
        assert asyncio.run(interlock.status(rid, store=project.store)).status == "COMPLETED"


def test_interlock_triggers_lists_next_fire_times_and_last_runs(project: CliProject) -> None:
    firer, _ = firer_for(project)
    now = dt.datetime.now(dt.UTC).timestamp()
    slot = last_slot(firer.workflows["greeter"].triggers[1], now)
    asyncio.run(firer.tick(slot + 1))
    out = project.cli("triggers", "greeter.yaml")
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    assert len(lines) == 3
    assert lines[1].startswith("half-minute  every 30s, input {\"who\": \"interval\"}: next ")
    assert "last run greeter.trigger-half-minute." in lines[1] and "COMPLETED" in lines[1]
    assert "schedule */15 * * * *" in lines[0]
    result, data = project.cli_json("triggers", "greeter.yaml")
    assert result.exit_code == 0
    assert [d["kind"] for d in data] == ["schedule", "every", "poll"]
    assert data[1]["next"] > now and data[1]["last_run"]["status"] == "COMPLETED"


@pytest.mark.parametrize(("trigger", "expected"), [
    ("{schedule: '61 * * * *', input: {who: x}}",
     "trigger 1: schedule '61 * * * *' is not a cron expression"),
    ("{schedule: '* * *', input: {who: x}}", "has 3 fields; cron has five"),
    ("{every: 30s}", "trigger 1: the workflow declares input ['who'], which this trigger's "
                     "input: does not give"),
    ("{poll: '{mod}:nosuch', every: 1m}", "trigger 1: call target"),
    ("{poll: '{mod}:source'}", "a poll trigger needs every:"),
    ("{every: 30s, schedule: '* * * * *', input: {who: x}}", "exactly one of them"),
])
def test_validate_refuses_a_trigger_that_cannot_fire(make_project: Callable[..., CliProject],
                                                     trigger: str, expected: str) -> None:
    p = make_project(NODES, prefix="trig")
    p.workflow(f"""
    workflow: bad
    input: [who]
    nodes:
      hello: {{mod}}:hello
    edges:
      - {{from: START, to: hello}}
    triggers:
      - {trigger}
    """, "bad.yaml")
    from click.testing import CliRunner

    from interlock.cli import cli

    out = CliRunner().invoke(cli, ["validate", "bad.yaml"], catch_exceptions=False)
    assert out.exit_code == 2, out.output
    assert "bad.yaml:9:" in out.output and expected in out.output, out.output
