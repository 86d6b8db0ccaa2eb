"""Two would-be owners of one run, with real ``interlock worker`` processes: the harness
of tests/ops/test_two_owners.py (one or two trials) and bench/two_owners.py (26 timed
trials each, figures in bench/HISTORY.md, "Two owners of one run").

A run of ``owners``: ``work`` (``async def``) records the effect ``before`` with
``ctx.once``, waits (``await asyncio.sleep``) for a go file, then -- in mode ``block`` --
blocks its event loop with ``time.sleep`` for longer than the lease, and records the
effect ``after``; ``post`` records ``post``. Every effect appends one line to
``effects.log`` (one ``write`` in append mode), so an effect run twice shows.

- ``block``: worker A executes the run and blocks its loop for ``block`` seconds (more
  than the lease) while worker B polls for runnable runs. The lease is renewed by A's
  lease-keeper thread, so B never claims the run.
- ``stop``: worker A is SIGSTOPped while ``work`` waits for the go file, past its lease;
  B takes the run over; then A is SIGCONTed and the go file written. A must stop
  (its renewal or ``ctx.once``'s check finds the claim gone) without running ``after``;
  B completes the run.

Each trial checks: the run COMPLETED and verifies; each effect ran exactly once; one
``node.completed`` per node; and, for ``stop``, that A said the run moved to another
owner, and how long after SIGCONT it said so.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import interlock
from interlock._store import open_store

REPO = Path(interlock.__file__).resolve().parent.parent

NODES = '''
import asyncio, os, time
from pathlib import Path

DIR = Path(os.environ["TWO_DIR"])

def effect(run_id, key):
    with open(DIR / "effects.log", "a") as f:
        f.write(f"{run_id} {key} {os.getpid()}\\n")
    return key

async def work(state, ctx):
    await ctx.once("before", effect, ctx.run_id, "before")
    (DIR / f"{ctx.run_id}.waiting.{os.getpid()}").write_text("")
    while not (DIR / f"{ctx.run_id}.go").exists():
        await asyncio.sleep(0.02)
    if state["mode"] == "block":
        time.sleep(float(os.environ["TWO_BLOCK"]))  # the event loop is blocked
    await ctx.once("after", effect, ctx.run_id, "after")
    return {"n": 1}

async def post(state, ctx):
    await ctx.once("post", effect, ctx.run_id, "post")
    return {"n": 2}
'''

FLOW = '''
workflow: owners
input: [mode, n]
nodes:
  work: twonodes:work
  post: twonodes:post
edges:
  - {from: START, to: work}
  - {from: work, to: post}
  - {from: post, to: END}
'''


class Worker:
    """A running ``interlock worker``; its stderr lines with their arrival times."""

    def __init__(self, workdir: Path, store: str, lease: float, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "interlock", "worker", "--store", store, "--poll", "0.05",
             "--lease", str(lease), "--drain", "5", "--workflows", "flows"],
            cwd=workdir, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
            env=env)
        self.lines: list[tuple[float, str]] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.wait_for("worker started")

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._changed:
                self.lines.append((time.monotonic(), line))
                self._changed.notify_all()

    def text(self) -> str:
        return "".join(line for _, line in self.lines)

    def first(self, needle: str) -> float | None:
        return next((t for t, line in self.lines if needle in line), None)

    def wait_for(self, needle: str, timeout: float = 60) -> float:
        deadline = time.monotonic() + timeout
        with self._changed:
            while (at := self.first(needle)) is None:
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise AssertionError(f"no {needle!r} from the worker; it said:\n"
                                         f"{self.text()}")
                self._changed.wait(min(left, 0.5))
        return at

    def stop(self) -> None:
        if self.proc.poll() is None:
            with_signal(self.proc, signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()


def with_signal(proc: subprocess.Popen[str], sig: int) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, sig)


@dataclass
class Trial:
    mode: str
    run_id: str
    status: str = ""
    verified: bool = False
    effects: Counter[str] = field(default_factory=Counter)
    completed: Counter[str] = field(default_factory=Counter)
    b_claimed: bool = False
    # (stop) B could not write while A was stopped: A held SQLite's write lock (stopped
    # inside a transaction), so there was no takeover to test -- try again
    no_takeover: bool = False
    a_told: bool = False  # A said the run moved to another owner
    stop_after_cont: float | None = None  # seconds from SIGCONT to A saying so
    seconds: float = 0.0
    a_text: str = ""
    b_text: str = ""

    @property
    def ok(self) -> bool:
        once = self.effects == Counter({"before": 1, "after": 1, "post": 1})
        one = self.completed == Counter({"work": 1, "post": 1})
        owners = (not self.b_claimed) if self.mode == "block" else \
            (self.b_claimed and self.a_told)
        return self.status == "COMPLETED" and self.verified and once and one and owners

    def why(self) -> str:
        return (f"{self.mode} trial of run {self.run_id}: status {self.status}, verified "
                f"{self.verified}, effects {dict(self.effects)}, completions "
                f"{dict(self.completed)}, B claimed {self.b_claimed}, A told "
                f"{self.a_told}\n--- worker A:\n{self.a_text}\n--- worker B:\n{self.b_text}")


def prepare(workdir: Path) -> dict[str, str]:
    """The node module and the flow in ``workdir``; the workers' environment."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "twonodes.py").write_text(NODES)
    (workdir / "flows").mkdir(exist_ok=True)
    (workdir / "flows" / "owners.yaml").write_text(textwrap.dedent(FLOW))
    (workdir / "effects.log").touch()
    env = {k: v for k, v in os.environ.items() if k not in ("INTERLOCK_STORE",
                                                            "INTERLOCK_LOG_KEY")}
    env["PYTHONPATH"] = os.pathsep.join([str(workdir), str(REPO)])
    env["TWO_DIR"] = str(workdir)
    return env


def _cli(workdir: Path, env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "interlock", *args], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise AssertionError(f"interlock {' '.join(args)}: {done.stderr}")
    return done.stdout.strip()


async def _wait_done(store: str, run_id: str, timeout: float) -> str:
    st = open_store(store)
    try:
        deadline = time.monotonic() + timeout
        while True:
            status = (await st.get_run(run_id)).summary.status
            if status in ("COMPLETED", "FAILED", "CANCELLED") or time.monotonic() > deadline:
                return status
            await asyncio.sleep(0.05)
    finally:
        await st.close()


async def _inspect(store: str, trial: Trial) -> None:
    st = open_store(store)
    try:
        trial.verified = (await interlock.verify(trial.run_id, store=st)).ok
        for entry in await st.entries(trial.run_id):
            rec = entry.record()
            if entry.type == "node.completed":
                trial.completed[str(rec.get("node"))] += 1
    finally:
        await st.close()


def _wait_file(pattern: str, workdir: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not list(workdir.glob(pattern)):
        if time.monotonic() > deadline:
            raise AssertionError(f"no {pattern} in {workdir}")
        time.sleep(0.02)


def trial(workdir: Path, store: str, mode: str, *, lease: float = 2.0,
          block: float = 5.0) -> Trial:
    """One trial (see the module's docstring) in ``workdir`` (`prepare`d) on ``store``."""
    env = prepare(workdir)
    env["TWO_BLOCK"] = str(block)
    began = time.monotonic()
    a = Worker(workdir, store, lease, env)
    b: Worker | None = None
    try:
        run_id = _cli(workdir, env, "run", "--detach", "flows/owners.yaml", "--store", store,
                      "--input", json.dumps({"mode": mode, "n": 0}))
        result = Trial(mode, run_id)
        a.wait_for(f"claimed run {run_id}")
        _wait_file(f"{run_id}.waiting.{a.proc.pid}", workdir)
        b = Worker(workdir, store, lease, env)  # idle, polling: it takes what it can
        if mode == "block":
            (workdir / f"{run_id}.go").write_text("")
        else:
            with_signal(a.proc, signal.SIGSTOP)
            try:
                b.wait_for(f"claimed run {run_id}", timeout=lease * 5 + 15)
                _wait_file(f"{run_id}.waiting.{b.proc.pid}", workdir)
            except AssertionError:
                if "cannot claim runs from the store" not in b.text():
                    raise
                result.no_takeover = True
            cont = time.monotonic()
            with_signal(a.proc, signal.SIGCONT)
            (workdir / f"{run_id}.go").write_text("")
            try:
                if not result.no_takeover:
                    told = a.wait_for("moved to", timeout=lease * 5 + 10)
                    result.stop_after_cont = told - cont
            except AssertionError:  # (an interlock that does not stop: the checks tell)
                pass
        result.status = asyncio.run(_wait_done(store, run_id, block + lease * 10 + 60))
        asyncio.run(_inspect(store, result))
    finally:
        a.stop()
        if b is not None:
            b.stop()
    result.seconds = time.monotonic() - began
    result.b_claimed = b is not None and b.first(f"claimed run {run_id}") is not None
    result.a_told = a.first("moved to") is not None
    result.a_text, result.b_text = a.text(), b.text() if b is not None else ""
    for line in (workdir / "effects.log").read_text().splitlines():
        rid, key, _pid = line.split()
        if rid == run_id:
            result.effects[key] += 1
    return result
