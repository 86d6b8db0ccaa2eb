"""Process isolation (``isolation: process``): real worker processes, real time, no mocks.

Node functions live in a module written into tmp_path (the worker imports them by
``module:function`` path, as it would a user's code). Every test checks, from /proc,
that no process it started is left: no child of this process (zombies included) and
nothing alive in a killed worker's process group.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import interlock
from interlock import END, START, Goto, Workflow
from interlock._engine._isolation import ChildContext, ChildResult, Effects, ProcessPool

NODES = '''
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
ENGINE_PID = int(os.environ.get("ISO_ENGINE_PID", "0"))


def isolated():
    # these nodes would hang, crash or exhaust the engine: refuse to run in its process
    if os.getpid() == ENGINE_PID:
        raise RuntimeError("this node ran in the engine's process, not in a worker process")


def mark(name):
    # written whole, then renamed: a worker killed mid-write leaves no empty pid file
    tmp = HERE / f".{name}.{os.getpid()}.tmp"
    tmp.write_text(str(os.getpid()))
    tmp.replace(HERE / f"{name}.{os.getpid()}.pid")


def add(state, ctx):
    ctx.record_tokens(7)
    ctx.record_tokens(5)
    return {"y": state["x"] + 1, "pid": os.getpid(), "node": ctx.node, "visit": ctx.visit,
            "key": ctx.idempotency_key, "cfg": ctx.config.get("k"), "tokens": ctx.tokens}


async def double(state):
    await asyncio.sleep(0.01)
    return {"y": state["x"] * 2, "pid": os.getpid()}


def pid(state):
    return {"pid": os.getpid()}


def spin(state):
    isolated()
    sleeper = subprocess.Popen(["sleep", "300"])  # a grandchild: must die with the group
    (HERE / "grandchild.pid").write_text(str(sleeper.pid))
    mark("spin")
    while True:
        pass


async def spin_async(state):
    isolated()
    mark("spin")
    while True:
        pass


async def loop_info(state):
    loop = asyncio.get_running_loop()
    others = len(asyncio.all_tasks()) - 1  # what an earlier call left running
    loop.create_task(asyncio.sleep(3600))  # left behind on purpose
    return {"loop": id(loop), "others": others, "pid": os.getpid()}


def exit3(state):
    isolated()
    os._exit(3)


def segfault(state):
    isolated()
    import ctypes

    ctypes.string_at(0)


def hog(state):
    isolated()
    chunks = []
    while True:
        chunks.append(bytearray(16 * 1024 * 1024))


def one_big(state):
    isolated()
    return {"n": len(bytearray(400 * 1000 * 1000))}


def small(state):
    return {"n": len(bytearray(20 * 1000 * 1000))}


def boom(state):
    raise KeyError("missing thing")


def not_json(state):
    return {"x": object()}


def a_list(state):
    return [1, 2, 3]


def pick(state):
    import interlock

    return interlock.goto("b", {"picked": "b", "apid": os.getpid()})


def noisy(state):
    print("node output on stdout " * 1000)
    sys.stdout.flush()
    return {"stdin": sys.stdin.read()}


def env(state):
    return {"value": os.environ.get("ISO_TEST_VAR"), "pid": os.getpid(), "cwd": os.getcwd()}


def set_env(state):
    os.environ["ISO_LEAK"] = "leaked"
    return {"pid": os.getpid()}


def get_env(state):
    return {"leak": os.environ.get("ISO_LEAK"), "pid": os.getpid()}


def over_budget(state, ctx):
    try:
        ctx.record_tokens(100)
    except Exception as exc:
        return {"caught": type(exc).__name__, "message": str(exc), "tokens": ctx.tokens}
    return {"caught": None}


async def effect(state, ctx):
    def side_effect():
        with open(HERE / "effects.log", "a") as f:
            f.write("ran\\n")
        return {"charged": 42}

    return {"result": await ctx.once("charge", side_effect), "pid": os.getpid()}


def wait_then_fail(state):
    isolated()
    deadline = time.monotonic() + 20
    while len(list(HERE.glob("spin.*.pid"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    raise RuntimeError("sibling failed on purpose")


def nested():
    def inner(state):
        return {}

    return inner
'''


# -- /proc ---------------------------------------------------------------------------------


def _procs() -> list[tuple[int, str, int, int]]:
    """(pid, state, ppid, pgrp) of every process."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        out.append((int(entry.name), fields[0], int(fields[1]), int(fields[2])))
    return out


def children() -> set[int]:
    """Children of this process, zombies included (a zombie is a child nobody reaped)."""
    me = os.getpid()
    return {pid for pid, _, ppid, _ in _procs() if ppid == me}


def alive_in_group(pgid: int) -> list[int]:
    """Live members of a process group (an orphan the init process has not reaped yet is
    a zombie: dead)."""
    return [pid for pid, state, _, pgrp in _procs() if pgrp == pgid and state != "Z"]


def group_gone(pgid: int, seconds: float = 5.0) -> list[int]:
    """The live members of a process group once it has had a bounded moment to die: a
    group's SIGKILL is delivered asynchronously, and a member that is no child of ours
    (no wait() to block on) can still be exiting, on a loaded machine, as the pool
    returns. Polled until none is left (or ``seconds`` pass): [] when all are gone."""
    gone_by = time.monotonic() + seconds
    while (left := alive_in_group(pgid)) and time.monotonic() < gone_by:
        time.sleep(0.02)
    return left


def alive(pid: int) -> bool:
    return any(p == pid and state != "Z" for p, state, _, _ in _procs())


# -- fixtures ------------------------------------------------------------------------------


@pytest.fixture
def nodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The node module, importable here and (by the same path) in a worker."""
    name = f"isonodes_{uuid.uuid4().hex[:10]}"
    (tmp_path / f"{name}.py").write_text(NODES)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ISO_ENGINE_PID", str(os.getpid()))
    module = importlib.import_module(name)
    module.DIR = tmp_path
    before = children()
    yield module
    sys.modules.pop(name, None)
    left = children() - before
    assert not left, f"processes left behind: {left}"


CTX = ChildContext("run1", "n", 1, 1, "run1:n:1", {"k": "v"})


def call_path(module: Any, fn: str) -> str:
    return f"{module.__name__}:{fn}"


async def wait_for_files(directory: Path, pattern: str, count: int,
                         timeout: float = 20.0) -> list[Path]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = sorted(directory.glob(pattern))
        if len(found) >= count:
            return found
        await asyncio.sleep(0.02)
    raise AssertionError(f"{pattern}: {count} expected in {timeout}s")


# -- ProcessPool ---------------------------------------------------------------------------


def test_sync_and_async_nodes_return_update_and_tokens(nodes: Any) -> None:
    charged: list[int] = []

    async def main() -> tuple[ChildResult, ChildResult]:
        async with ProcessPool() as pool:
            r1 = await pool.call(call_path(nodes, "add"), {"x": 1}, CTX, timeout=30,
                                 on_tokens=charged.append)
            r2 = await pool.call(call_path(nodes, "double"), {"x": 4}, CTX, timeout=30)
            return r1, r2

    r1, r2 = asyncio.run(main())
    assert r1.error is None and r2.error is None
    assert r1.update == {"y": 2, "pid": r1.pid, "node": "n", "visit": 1, "key": "run1:n:1",
                         "cfg": "v", "tokens": 12}
    assert r1.pid != os.getpid()
    assert r1.tokens == 12 and charged == [7, 5]
    assert r1.value("n") == r1.update
    assert r2.update == {"y": 8, "pid": r2.pid} and r2.tokens == 0


def test_async_nodes_share_the_workers_loop_and_leave_no_tasks(nodes: Any) -> None:
    async def main() -> list[ChildResult]:
        async with ProcessPool() as pool:
            return [await pool.call(call_path(nodes, "loop_info"), {}, CTX, timeout=30)
                    for _ in range(2)]

    first, second = asyncio.run(main())
    assert first.pid == second.pid
    assert first.update["loop"] == second.update["loop"]
    assert first.update["others"] == second.update["others"] == 0


def test_worker_is_reused_for_consecutive_calls(nodes: Any) -> None:
    async def main() -> tuple[list[ChildResult], int]:
        async with ProcessPool() as pool:
            results = [await pool.call(call_path(nodes, "pid"), {}, CTX, timeout=30)
                       for _ in range(3)]
            return results, pool.spawned

    results, spawned = asyncio.run(main())
    assert [r.update["pid"] for r in results] == [results[0].pid] * 3
    assert [r.reused for r in results] == [False, True, True]
    assert spawned == 1


def test_busy_loop_is_killed_at_its_timeout_with_its_process_group(nodes: Any) -> None:
    async def main() -> tuple[int, float]:
        async with ProcessPool() as pool:
            # a worker started first: the timed call's budget is the node's, not the
            # interpreter's start on a loaded machine (the node must reach its loop)
            warm = await pool.call(call_path(nodes, "pid"), {}, CTX, timeout=30)
            t0 = time.perf_counter()
            with pytest.raises(TimeoutError, match=r"timed out after 2s.*was killed"):
                await pool.call(call_path(nodes, "spin"), {}, CTX, timeout=2.0)
            elapsed = time.perf_counter() - t0
            assert pool.pids() == []  # killed and reaped before call() raised
            return warm.pid, elapsed

    worker, elapsed = asyncio.run(main())
    # not left to its `sleep 300` grandchild: killed at the timeout, group and all
    assert elapsed < 60, f"took {elapsed:.2f}s"
    assert int(next(nodes.DIR.glob("spin.*.pid")).read_text()) == worker
    grandchild = int((nodes.DIR / "grandchild.pid").read_text())
    assert worker not in children()
    # the worker's session: itself and the `sleep`
    assert group_gone(worker) == []
    assert not alive(grandchild)


def test_async_busy_loop_is_killed_too(nodes: Any) -> None:
    async def main() -> int:
        async with ProcessPool() as pool:
            warm = await pool.call(call_path(nodes, "pid"), {}, CTX, timeout=30)
            with pytest.raises(TimeoutError):
                await pool.call(call_path(nodes, "spin_async"), {}, CTX, timeout=2.0)
            assert pool.pids() == []
            return warm.pid

    worker = asyncio.run(main())
    assert group_gone(worker) == []


def test_memory_limit_fails_the_call_alone(nodes: Any) -> None:
    async def main() -> list[ChildResult]:
        async with ProcessPool() as pool:
            hog = await pool.call(call_path(nodes, "hog"), {}, CTX, timeout=30,
                                  memory=200_000_000)
            big = await pool.call(call_path(nodes, "one_big"), {}, CTX, timeout=30,
                                  memory=200_000_000)
            fits = await pool.call(call_path(nodes, "small"), {}, CTX, timeout=30,
                                   memory=200_000_000)
            after = await pool.call(call_path(nodes, "one_big"), {}, CTX, timeout=30)
            assert pool.pids() == [after.pid]  # memory-limited workers are not kept
            return [hog, big, fits, after]

    hog, big, fits, after = asyncio.run(main())
    for res in (hog, big):
        assert res.error is not None
        err = res.node_error("n")
        assert err is not None
        assert "MemoryError" in str(err) or "memory limit" in str(err)
        assert "200MB" in str(err)
    assert fits.error is None and fits.update == {"n": 20_000_000}
    assert after.error is None and after.update == {"n": 400_000_000}  # no limit: fine
    assert len({hog.pid, big.pid, fits.pid, after.pid}) == 4


def test_memory_limit_below_the_interpreter_is_a_clear_error(nodes: Any) -> None:
    async def main() -> ChildResult:
        async with ProcessPool() as pool:
            return await pool.call(call_path(nodes, "pid"), {}, CTX, timeout=30,
                                   memory=1_000_000)

    res = asyncio.run(main())
    assert res.error is not None and res.error["kind"] == "start"
    assert "cannot run under a memory limit of 1MB" in res.error["message"]


def test_exit_and_segfault_are_reported_as_the_nodes_error(nodes: Any) -> None:
    async def main() -> list[ChildResult]:
        async with ProcessPool() as pool:
            return [await pool.call(call_path(nodes, fn), {}, CTX, timeout=30)
                    for fn in ("pid", "exit3", "segfault", "pid")]

    warm, exited, segv, later = asyncio.run(main())
    assert exited.error is not None and exited.error["exception"] == "WorkerCrashError"
    assert "exited with code 3" in exited.error["message"]
    assert exited.pid == warm.pid  # the idle worker took the call, and died of it
    assert segv.error is not None
    assert "died with signal SIGSEGV" in segv.error["message"]
    assert "segfault" in segv.error["traceback"]  # faulthandler's stack of the node
    err = segv.node_error("n")
    assert err is not None and str(err).startswith("node 'n' crashed: its worker process")
    assert later.error is None and later.pid not in (exited.pid, segv.pid)


def test_close_kills_every_worker_and_is_idempotent(nodes: Any) -> None:
    async def main() -> list[int]:
        pool = ProcessPool(max_idle=3)
        try:
            results = await asyncio.gather(*(pool.call(call_path(nodes, "double"), {"x": i},
                                                       CTX, timeout=30) for i in range(3)))
            pids = pool.pids()
            assert len(pids) == 3 and all(r.error is None for r in results)
            assert all(p in children() for p in pids)
        finally:
            await pool.close()
        assert pool.pids() == []
        await pool.close()
        with pytest.raises(RuntimeError, match="closed"):
            await pool.call(call_path(nodes, "pid"), {}, CTX, timeout=30)
        return pids

    pids = asyncio.run(main())
    assert not set(pids) & children()
    assert all(group_gone(p) == [] for p in pids)


def test_idle_workers_are_capped(nodes: Any) -> None:
    async def main() -> int:
        async with ProcessPool(max_idle=1) as pool:
            await asyncio.gather(*(pool.call(call_path(nodes, "double"), {"x": i}, CTX,
                                             timeout=30) for i in range(3)))
            return pool.idle

    assert asyncio.run(main()) == 1


def test_cancelling_the_caller_kills_the_worker(nodes: Any) -> None:
    async def main() -> int:
        async with ProcessPool() as pool:
            task = asyncio.create_task(pool.call(call_path(nodes, "spin"), {}, CTX, timeout=60))
            (marker,) = await wait_for_files(nodes.DIR, "spin.*.pid", 1)
            worker = int(marker.read_text())
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert pool.pids() == []
            assert worker not in children()
            return worker

    worker = asyncio.run(main())
    assert group_gone(worker) == []
    assert not alive(int((nodes.DIR / "grandchild.pid").read_text()))


def test_node_failures_and_bad_values_are_errors(nodes: Any) -> None:
    async def main() -> dict[str, ChildResult]:
        async with ProcessPool() as pool:
            out = {fn: await pool.call(call_path(nodes, fn), {}, CTX, timeout=30)
                   for fn in ("boom", "not_json", "a_list", "pick")}
            out["nomodule"] = await pool.call("no_such_module_here:f", {}, CTX, timeout=30)
            out["badstate"] = await pool.call(call_path(nodes, "pid"), {"x": object()}, CTX,
                                              timeout=30)
            assert pool.spawned == 1  # none of these cost the worker
            return out

    out = asyncio.run(main())
    boom = out["boom"].error
    assert boom is not None and boom["kind"] == "raised" and boom["exception"] == "KeyError"
    assert "missing thing" in boom["message"] and "in boom" in boom["traceback"]
    assert boom["mro"][:2] == ["KeyError", "LookupError"]
    err = out["boom"].node_error("n")
    assert err is not None and err.details["exception"] == "KeyError"
    # the line of the node's code it came from, found in the worker process
    assert boom["at"].endswith(" in boom") and f"{nodes.__name__}.py:" in boom["at"]
    assert err.details["at"] == boom["at"]
    assert str(err) == f"node 'n' raised KeyError: 'missing thing' (at {boom['at']})"
    with pytest.raises(type(err), match="raised KeyError"):
        out["boom"].value("n")
    assert "is not JSON data" in str(out["not_json"].node_error("n"))
    assert "returned list; a node returns a mapping" in str(out["a_list"].node_error("n"))
    assert out["pick"].returned() == Goto("b", {"picked": "b", "apid": out["pick"].pid})
    assert "No module named 'no_such_module_here'" in str(out["nomodule"].node_error("n"))
    bad = out["badstate"].node_error("n")
    assert bad is not None and "not JSON data" in str(bad)


def test_lambda_paths_are_refused_with_a_reason(nodes: Any) -> None:
    async def main() -> ChildResult:
        async with ProcessPool() as pool:
            return await pool.call(f"{nodes.__name__}:nested.<locals>.inner", {}, CTX,
                                   timeout=30)

    res = asyncio.run(main())
    err = res.node_error("n")
    assert err is not None and "could not be loaded in its worker process" in str(err)
    assert "must be a module-level function" in str(err)


def test_print_and_stdin_do_not_touch_the_protocol(nodes: Any) -> None:
    async def main() -> ChildResult:
        async with ProcessPool() as pool:
            return await pool.call(call_path(nodes, "noisy"), {}, CTX, timeout=30)

    res = asyncio.run(main())
    assert res.error is None and res.update == {"stdin": ""}


def test_worker_imports_little(nodes: Any) -> None:
    lean = f"isolean_{uuid.uuid4().hex[:10]}"
    (nodes.DIR / f"{lean}.py").write_text(textwrap.dedent('''
        import sys

        def modules(state):
            return {"loaded": sorted({m.split(".")[0] for m in sys.modules}
                                     & {"asyncio", "pydantic", "interlock"})}
    '''))

    async def main() -> ChildResult:
        async with ProcessPool() as pool:
            return await pool.call(f"{lean}:modules", {}, CTX, timeout=30)

    res = asyncio.run(main())
    assert res.update == {"loaded": ["interlock"]}  # no pydantic, no asyncio for a sync node


def test_environment_changes_reach_the_workers_and_do_not_leak(
        nodes: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> list[ChildResult]:
        async with ProcessPool() as pool:
            first = await pool.call(call_path(nodes, "env"), {}, CTX, timeout=30)
            monkeypatch.setenv("ISO_TEST_VAR", "set later")
            second = await pool.call(call_path(nodes, "env"), {}, CTX, timeout=30)
            leak = await pool.call(call_path(nodes, "set_env"), {}, CTX, timeout=30)
            after = await pool.call(call_path(nodes, "get_env"), {}, CTX, timeout=30)
            return [first, second, leak, after]

    first, second, leak, after = asyncio.run(main())
    assert first.update["value"] is None and first.update["cwd"] == str(nodes.DIR)
    assert second.update["value"] == "set later"
    assert second.pid != first.pid  # the old worker had the old environment
    assert after.pid == leak.pid and after.update["leak"] is None


def test_a_dead_idle_worker_is_replaced(nodes: Any) -> None:
    async def main() -> tuple[ChildResult, ChildResult]:
        async with ProcessPool() as pool:
            first = await pool.call(call_path(nodes, "pid"), {}, CTX, timeout=30)
            assert first.pid is not None
            os.kill(first.pid, signal.SIGKILL)
            second = await pool.call(call_path(nodes, "pid"), {}, CTX, timeout=30)
            return first, second

    first, second = asyncio.run(main())
    assert second.error is None and second.pid != first.pid


def test_tokens_raise_what_the_engine_raises(nodes: Any) -> None:
    from interlock import NodeError

    def refuse(n: int) -> None:
        raise NodeError(f"budget exceeded by {n}")

    async def main() -> ChildResult:
        async with ProcessPool() as pool:
            return await pool.call(call_path(nodes, "over_budget"), {}, CTX, timeout=30,
                                   on_tokens=refuse)

    res = asyncio.run(main())
    assert res.update == {"caught": "NodeError", "message": "budget exceeded by 100",
                          "tokens": 100}
    assert res.tokens == 100


def test_ctx_once_goes_through_the_engines_journal(nodes: Any) -> None:
    journal: dict[str, Any] = {}

    async def record(key: str, result: Any) -> Any:
        journal[key] = result
        return result

    effects = Effects(lambda key: (key in journal, journal.get(key)), record)

    async def main() -> list[ChildResult]:
        async with ProcessPool() as pool:
            return [await pool.call(call_path(nodes, "effect"), {}, CTX, timeout=30,
                                    effects=effects) for _ in range(2)]

    first, second = asyncio.run(main())
    assert first.update == second.update == {"result": {"charged": 42}, "pid": first.pid}
    assert journal == {"charge": {"charged": 42}}
    assert (nodes.DIR / "effects.log").read_text() == "ran\n"  # once, not twice


def test_ctx_once_without_a_journal_says_so(nodes: Any) -> None:
    async def main() -> ChildResult:
        async with ProcessPool() as pool:
            return await pool.call(call_path(nodes, "effect"), {}, CTX, timeout=30)

    res = asyncio.run(main())
    assert "ctx.once is not available in an isolated node yet" in str(res.node_error("n"))


def test_functions_of_a_main_script_run_in_workers(tmp_path: Path) -> None:
    script = tmp_path / "flow.py"
    script.write_text(textwrap.dedent('''
        import asyncio, os
        from interlock._engine._isolation import ChildContext, ProcessPool

        def square(state):
            return {"y": state["x"] ** 2, "pid": os.getpid()}

        async def main():
            async with ProcessPool() as pool:
                ctx = ChildContext("r", "n", 1, 1, "r:n:1")
                res = await pool.call("__main__:square", {"x": 9}, ctx, timeout=30)
                assert res.error is None, res.error
                assert res.update["pid"] != os.getpid()
                print(res.update["y"])

        if __name__ == "__main__":
            asyncio.run(main())
    '''))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "81"


def test_a_busy_worker_dies_with_a_killed_engine(nodes: Any) -> None:
    engine = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f'''
        import asyncio, sys
        sys.path.insert(0, {str(nodes.DIR)!r})
        from interlock._engine._isolation import ChildContext, ProcessPool

        async def main():
            pool = ProcessPool()
            await pool.call("{nodes.__name__}:spin_async", {{}},
                            ChildContext("r", "n", 1, 1, "r:n:1"), timeout=300)

        asyncio.run(main())
    ''')], cwd=nodes.DIR)
    try:
        (marker,) = asyncio.run(wait_for_files(nodes.DIR, "spin.*.pid", 1, timeout=60))
        worker = int(marker.read_text())
        assert alive(worker)
    finally:
        engine.kill()  # SIGKILL: no cleanup code of the engine runs
        engine.wait()
    deadline = time.monotonic() + 10
    while alive(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(worker)


# -- through the engine (Workflow.run) -------------------------------------------------------


def one_node(fn: Any, **options: Any) -> Workflow:
    wf = Workflow("iso")
    wf.node("n", fn, isolation="process", **options)
    wf.edge(START, "n").edge("n", END)
    return wf


def test_engine_runs_an_isolated_node(nodes: Any) -> None:
    wf = one_node(nodes.add, timeout="30s")
    result = wf.run_sync({"x": 41}, store="memory://", config={"k": "v"})
    assert result.status == "COMPLETED", result.error
    assert result.state["y"] == 42 and result.state["pid"] != os.getpid()
    assert result.state["cfg"] == "v" and result.state["node"] == "n"
    assert result.tokens == 12


def test_engine_journals_ctx_once_of_an_isolated_node(nodes: Any) -> None:
    records: list[dict[str, Any]] = []
    wf = one_node(nodes.effect, timeout="30s")
    result = wf.run_sync({}, store="memory://", listener=lambda rec, view: records.append(rec))
    assert result.status == "COMPLETED", result.error
    assert result.state == {"result": {"charged": 42}, "pid": result.state["pid"]}
    assert result.state["pid"] != os.getpid()
    effects = [r for r in records if r["type"] == "effect.recorded"]
    assert [(r["key"], r["result"]) for r in effects] == [("charge", {"charged": 42})]


def test_engine_follows_a_goto_from_an_isolated_node(nodes: Any) -> None:
    wf = Workflow("iso-goto")
    wf.node("a", nodes.pick, isolation="process", timeout="30s")
    wf.node("b", nodes.pid)
    wf.node("c", nodes.pid)
    wf.edge(START, "a").choose("a", ["b", "c"]).edge("b", END).edge("c", END)
    result = wf.run_sync({}, store="memory://")
    assert result.status == "COMPLETED", result.error
    assert result.state["picked"] == "b" and result.state["apid"] != os.getpid()


def test_engine_kills_a_busy_loop_at_its_timeout(nodes: Any) -> None:
    wf = one_node(nodes.spin, timeout="1s")
    t0 = time.perf_counter()
    result = wf.run_sync({}, store="memory://")
    elapsed = time.perf_counter() - t0
    assert result.status == "FAILED"
    assert result.error is not None and "timed out" in result.error["message"]
    assert elapsed < 2.0, f"took {elapsed:.2f}s"
    worker = int(next(nodes.DIR.glob("spin.*.pid")).read_text())
    assert group_gone(worker) == []  # (failed once in CI under load without the wait)
    assert not alive(int((nodes.DIR / "grandchild.pid").read_text()))


def test_engine_survives_a_node_over_its_memory_limit(nodes: Any) -> None:
    result = one_node(nodes.hog, timeout="30s", memory="200MB").run_sync({}, store="memory://")
    assert result.status == "FAILED"
    assert result.error is not None
    assert "MemoryError" in result.error["message"] or "memory limit" in result.error["message"]
    again = one_node(nodes.small, timeout="30s", memory="200MB").run_sync({}, store="memory://")
    assert again.status == "COMPLETED", again.error
    assert again.state == {"n": 20_000_000}


def test_engine_reports_a_crashed_node(nodes: Any) -> None:
    result = one_node(nodes.segfault, timeout="30s").run_sync({}, store="memory://")
    assert result.status == "FAILED"
    assert result.error is not None and "SIGSEGV" in result.error["message"]


def fan_out(nodes: Any, names: dict[str, Any]) -> Workflow:
    wf = Workflow("iso-fan")
    for name, fn in names.items():
        wf.node(name, fn, isolation="process", timeout="60s")
    wf.edge(START, list(names))
    wf.edge(list(names), END)
    return wf


def test_cancel_stops_a_run_mid_fan_out_with_no_process_left(nodes: Any) -> None:
    wf = fan_out(nodes, {"a": nodes.spin_async, "b": nodes.spin_async, "c": nodes.spin_async})

    async def main() -> list[int]:
        task = asyncio.create_task(wf.run({}, store="memory://"))
        markers = await wait_for_files(nodes.DIR, "spin.*.pid", 3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return [int(m.read_text()) for m in markers]

    workers = asyncio.run(main())
    assert not set(workers) & children()
    assert all(group_gone(w) == [] for w in workers)


def test_a_failing_sibling_stops_the_isolated_branches(nodes: Any) -> None:
    wf = fan_out(nodes, {"a": nodes.spin_async, "b": nodes.spin_async,
                         "c": nodes.wait_then_fail})
    t0 = time.perf_counter()
    result = wf.run_sync({}, store="memory://")
    assert result.status == "FAILED"
    assert result.error is not None and "sibling failed on purpose" in result.error["message"]
    assert time.perf_counter() - t0 < 30
    workers = [int(m.read_text()) for m in nodes.DIR.glob("spin.*.pid")]
    assert len(workers) == 2
    assert all(group_gone(w) == [] for w in workers)


def test_interlock_cancel_stops_an_isolated_fan_out_with_no_process_left(
        nodes: Any, tmp_path: Path) -> None:
    wf = fan_out(nodes, {"a": nodes.spin_async, "b": nodes.spin_async, "c": nodes.spin_async})
    store = f"sqlite:///{tmp_path}/runs.db"

    async def main() -> tuple[Any, Any, list[int]]:
        task = asyncio.create_task(wf.run({}, store=store, run_id="iso-cancel"))
        markers = await wait_for_files(nodes.DIR, "spin.*.pid", 3)
        answer = await interlock.cancel("iso-cancel", by="ops", store=store)
        return answer, await task, [int(m.read_text()) for m in markers]

    answer, result, workers = asyncio.run(main())
    assert answer.status == "CANCELLED" and result.status == "CANCELLED"
    assert "ops" in result.error["message"]
    assert not set(workers) & children()
    assert all(group_gone(w) == [] for w in workers)
