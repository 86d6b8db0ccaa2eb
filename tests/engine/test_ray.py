"""``executor: ray`` (SPEC §9): a node's body as a Ray task (an async body on an async
actor) on a real local Ray, started once for the module; the log, the fold and the
decisions stay in the engine. Skipped without Ray (`pip install 'interlock[ray]'`)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from click.testing import CliRunner

import interlock
from interlock.cli import cli

if TYPE_CHECKING:
    from conftest import CliProject

try:
    import ray
except ImportError:  # the tests that need a cluster skip; validation's run anyway
    ray = None

NODES = '''
import asyncio
import os
import time
from pathlib import Path


def where(s, ctx):
    ctx.record_tokens(7)
    return {"pid": os.getpid(), "n": s["n"] + 1, "attempt": ctx.attempt}


async def awhere(s):
    await asyncio.sleep(0.01)
    return {"apid": os.getpid()}


def boom(s):
    raise KeyError("no such customer on the cluster")


def handled(s):
    return {"handled": s["error"]["type"]}


def flaky(s):
    n = len(list(Path(".").glob("flaky.*")))
    Path(f"flaky.{n}").write_text("")
    if n == 0:
        raise ConnectionError("the service is down")
    return {"tries": n + 1}


def crash_once(s):
    if not Path("crashed").exists():
        Path("crashed").write_text("")
        os._exit(1)  # the Ray worker dies mid-task
    return {"survived": True}


def slow(s):
    Path("slow.pid").write_text(str(os.getpid()))
    time.sleep(60)
    return {"late": True}


def spend(s, ctx):
    ctx.record_tokens(500)
    return {"spent": 500}


def uses_once(s, ctx):
    import asyncio
    return asyncio.run(ctx.once("charge", print, "x"))
'''


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    if ray is None:
        pytest.skip("Ray is not installed: pip install 'interlock[ray]'")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture
def project(ray_cluster: None, make_project: Callable[..., CliProject]) -> CliProject:
    return make_project(NODES, prefix="raynodes")


def run(p: CliProject, text: str, data: dict[str, Any] | None = None) -> interlock.RunResult:
    wf = interlock.load(p.workflow(text))
    return wf.run_sync(data or {}, store=p.store)


def test_a_sync_and_an_async_body_run_on_ray_and_their_updates_come_back(
        project: CliProject) -> None:
    result = run(project, """
    workflow: on_ray
    input: [n]
    nodes:
      where: {call: {mod}:where, executor: ray, resources: {num_cpus: 1}}
      awhere: {call: {mod}:awhere, executor: ray}
    edges:
      - {from: START, to: where}
      - {from: where, to: awhere}
    """, {"n": 1})
    assert result.status == "COMPLETED", result.error
    assert result.state["n"] == 2 and result.state["attempt"] == 1
    # both bodies ran in Ray's worker processes, not in the engine's
    assert result.state["pid"] != os.getpid() and result.state["apid"] != os.getpid()
    assert result.tokens == 7  # recorded on Ray, charged when the call returned
    done = [r for r in project.records(result.run_id) if r["type"] == "node.completed"]
    assert [(r["node"], r.get("tokens")) for r in done] == [("where", 7), ("awhere", None)]


def test_an_exception_on_ray_keeps_its_type_for_on_error(project: CliProject) -> None:
    result = run(project, """
    workflow: on_ray_error
    nodes:
      boom: {call: {mod}:boom, executor: ray}
      handled: {mod}:handled
    edges:
      - {from: START, to: boom}
      - {from: boom, to: handled, on_error: [KeyError]}
    """)
    assert result.status == "COMPLETED", result.error
    assert result.state["handled"] == "KeyError"
    failed = next(r for r in project.records(result.run_id) if r["type"] == "node.failed")
    error = failed["error"]
    assert error["details"]["exception"] == "KeyError", error
    assert "no such customer on the cluster" in error["message"]
    assert "raised on Ray" in error["details"]["traceback"]  # the remote traceback too


def test_retry_errors_match_an_exception_raised_on_ray(project: CliProject) -> None:
    result = run(project, """
    workflow: on_ray_retry
    nodes:
      flaky: {call: {mod}:flaky, executor: ray, retry: {attempts: 3, errors: [ConnectionError]}}
    edges:
      - {from: START, to: flaky}
    """)
    assert result.status == "COMPLETED", result.error
    assert result.state["tries"] == 2
    types = [r["type"] for r in project.records(result.run_id) if r.get("node") == "flaky"]
    assert types == ["node.started", "node.retrying", "node.started", "node.completed"]


def test_a_lost_ray_worker_is_a_node_error_and_is_retried(project: CliProject) -> None:
    result = run(project, """
    workflow: on_ray_crash
    nodes:
      crash: {call: {mod}:crash_once, executor: ray, retry: {attempts: 2}}
    edges:
      - {from: START, to: crash}
    """)
    assert result.status == "COMPLETED", result.error
    assert result.state["survived"] is True
    retrying = next(r for r in project.records(result.run_id) if r["type"] == "node.retrying")
    assert "WorkerCrashedError" in retrying["error"]["message"], retrying["error"]


def test_a_timeout_kills_the_ray_task(project: CliProject) -> None:
    result = run(project, """
    workflow: on_ray_timeout
    nodes:
      slow: {call: {mod}:slow, executor: ray, timeout: 3s}
    edges:
      - {from: START, to: slow}
    """)
    assert result.status == "FAILED"
    assert result.error is not None and "timed out after 3s" in result.error["message"]
    assert result.error["message"].endswith("(its Ray task was cancelled)")
    pid = int(Path("slow.pid").read_text())
    deadline = time.monotonic() + 30
    while _alive(pid):  # ray.cancel(force=True) kills the worker process running it
        assert time.monotonic() < deadline, f"the Ray worker {pid} still runs the timed-out node"
        time.sleep(0.1)


def test_tokens_recorded_on_ray_count_against_the_nodes_budget(project: CliProject) -> None:
    result = run(project, """
    workflow: on_ray_budget
    nodes:
      spend: {call: {mod}:spend, executor: ray, tokens: 100}
    edges:
      - {from: START, to: spend}
    """)
    assert result.status == "FAILED"
    assert result.error is not None and result.error["type"] == "budget_exceeded"
    assert result.tokens == 500


def test_ctx_once_on_ray_is_refused_with_a_message(project: CliProject) -> None:
    result = run(project, """
    workflow: on_ray_once
    nodes:
      once: {call: {mod}:uses_once, executor: ray}
    edges:
      - {from: START, to: once}
    """)
    assert result.status == "FAILED"
    assert result.error is not None
    assert "runs on Ray (executor: ray), where ctx.once cannot reach" in result.error["message"]



def test_a_worker_with_executor_ray_runs_every_call_node_on_ray(project: CliProject) -> None:
    """`interlock worker --executor ray`: the bodies of the nodes that name no executor
    run on the cluster (at RAY_ADDRESS: the tests' Ray), the run's log says so."""
    import signal
    import subprocess
    import sys

    name = project.workflow("""
    workflow: plain
    input: [n]
    nodes:
      where: {mod}:where
    edges:
      - {from: START, to: where}
    """, "plain.yaml")
    wf = interlock.load(name)
    rid = wf.submit_sync({"n": 1}, store=project.store).run_id
    address = ray.get_runtime_context().gcs_address
    proc = subprocess.Popen(
        [sys.executable, "-m", "interlock", "worker", "--store", project.store, "--poll",
         "0.05", "--executor", "ray"], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
        text=True, env={**os.environ, "RAY_ADDRESS": address, "PYTHONPATH": os.getcwd()})
    try:
        deadline = time.monotonic() + 120
        while _status(rid, project.store) != "COMPLETED":
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "the worker did not complete the run"
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "node bodies on Ray" in err
    records = project.records(rid)
    resumed = next(r for r in records if r["type"] == "run.resumed")
    assert resumed["executor"] == "ray" and resumed["worker"]
    done = next(r for r in records if r["type"] == "node.completed")
    assert done["update"]["pid"] not in (os.getpid(), proc.pid)  # a Ray worker's


def _status(run_id: str, store: str) -> str:
    import asyncio

    return asyncio.run(interlock.status(run_id, store=store)).status


@pytest.mark.parametrize(("node", "expected"), [
    ("{approval: {show: [n]}, executor: ray}",
     "executor: ray runs a call node's function as a Ray task"),
    ("{call: '{mod}:where', isolation: process, executor: ray}",
     "executor: ray and isolation: process both say where the body runs"),
    ("{call: '{mod}:where', resources: {num_cpus: 2}}",
     "'resources' are what a Ray task asks the cluster for; they go with executor: ray"),
    ("{call: '{mod}:where', executor: ray, resources: {num_cpus: -1}}", "num_cpus"),
])
def test_validate_refuses_what_ray_cannot_run(make_project: Callable[..., CliProject],
                                              node: str, expected: str) -> None:
    p = make_project(NODES, prefix="raynodes")
    p.workflow(f"""
    workflow: bad
    nodes:
      x: {node}
    edges:
      - {{from: START, to: x}}
    """, "bad.yaml")
    out = CliRunner().invoke(cli, ["validate", "bad.yaml"], catch_exceptions=False)
    assert out.exit_code == 2, out.output
    assert "bad.yaml:4:" in out.output and expected in out.output, out.output


def test_validate_says_how_to_install_ray_when_it_is_missing(
        make_project: Callable[..., CliProject], monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "ray" else find_spec(name, *a))
    p = make_project(NODES, prefix="raynodes")
    p.workflow("""
    workflow: needs_ray
    nodes:
      x: {call: '{mod}:boom', executor: ray}
    edges:
      - {from: START, to: x}
    """, "needs.yaml")
    out = CliRunner().invoke(cli, ["validate", "needs.yaml"], catch_exceptions=False)
    assert out.exit_code == 2, out.output
    assert "needs.yaml:4:" in out.output
    # (this interlock runs from its checkout: the checkout's extra, not a package's)
    hint = f"pip install -e '{Path(interlock.__file__).resolve().parents[1]}[ray]'"
    assert "node 'x': executor: ray runs its body on Ray, which is not installed here: " \
        f"{hint}" in out.output
    started = CliRunner().invoke(cli, ["run", "needs.yaml", "--store", p.store],
                                 catch_exceptions=False)
    assert started.exit_code == 2 and hint in started.output
    assert not p.db.exists() or p.sql("SELECT count(*) FROM runs") == [(0,)]  # nothing started


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (killed, not yet reaped by its raylet) is not running the node any more
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


# -- where a node's exception on Ray came from ------------------------------------------

ORIGIN_NODES = '''
def lookup(s):
    return s["customers"]["missing"]


def fails(s):
    return lookup(s)


async def afails(s):
    return lookup(s)
'''


def test_an_exception_on_ray_names_the_line_of_the_users_code(
        ray_cluster: None, make_project: Callable[..., CliProject]) -> None:
    """As in-process: ``raised KeyError: 'missing' (at MODULE.py:3 in lookup)``, also as
    ``details.at``, for a Ray task and an async actor's call. Before, the traceback did
    not travel with the exception and the error named no line."""
    p = make_project(ORIGIN_NODES, prefix="rayorigin")
    for node in ("fails", "afails"):
        result = run(p, f"""
        workflow: on_ray_origin
        input: [customers]
        nodes:
          x: {{call: '{{mod}}:{node}', executor: ray}}
        edges:
          - {{from: START, to: x}}
        """, {"customers": {}})
        assert result.status == "FAILED"
        at = f"{p.mod}.py:3 in lookup"
        assert result.error is not None
        assert result.error["message"] == f"node 'x' raised KeyError: 'missing' (at {at})"
        assert result.error["details"]["at"] == at


def test_a_carried_origin_survives_pickling() -> None:
    """`_origin.carry` on the raising side; the unpickled exception (no traceback)
    names the same frame."""
    import pickle

    from interlock._engine._origin import carry, user_frame

    def helper() -> None:
        raise KeyError("missing")

    try:
        helper()
    except KeyError as exc:
        carry(exc)
        here = user_frame(exc)
        back = pickle.loads(pickle.dumps(exc))
    assert here is not None and here.endswith(" in helper")
    assert back.__traceback__ is None and user_frame(back) == here
