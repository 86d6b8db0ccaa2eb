"""`interlock serve` (SPEC §8) against a real server: a subprocess on a loopback port.

Each test starts ``python -m interlock serve --port 0`` in a scratch directory holding a
node module and workflow files, reads the port uvicorn bound from its log, and talks
HTTP to it (httpx) -- runs, the event stream, decisions, auth, notifications, SIGTERM.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

import pytest
from _harness import write_folder
from test_decision_race import store_urls

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

NODES = '''
import os, time
from pathlib import Path

def first(state):
    return {"first": state["n"] + 1}

def last(state):
    return {"last": state["first"] * 2}

def counted(state):
    with open("executions.log", "a") as f:
        f.write("counted\\n")
    return {"counted": True}

def slow(state):
    with open("executions.log", "a") as f:
        f.write("slow\\n")
    Path("slow.started").write_text(str(os.getpid()))
    while not Path("slow.release").exists():
        time.sleep(0.02)
    return {"slow": True}
'''

GATED = '''
workflow: gated
input: [n]
nodes:
  first: snodes:first
  gate: {approval: {show: [first], approvers: [alice, "role:admin"], on_modify: [first]}}
  last: snodes:last
edges:
  - {from: START, to: first}
  - {from: first, to: gate}
  - {from: gate, to: last, when: 'gate.decision == "approved"'}
  - {from: last, to: END}
'''

SLOW = '''
workflow: slow
nodes:
  counted: snodes:counted
  slow: snodes:slow
edges:
  - {from: START, to: counted}
  - {from: counted, to: slow}
  - {from: slow, to: END}
'''

def pythonpath(root: Path) -> str:
    """``root`` (the test's node modules) before the tree under test: a subprocess
    imports this checkout's interlock, not another one the environment has installed."""
    return os.pathsep.join([str(root), str(Path(__file__).resolve().parents[2]),
                            os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)


TOKENS = {"alice": ("tok-alice", ["approver"]), "bob": ("tok-bob", ["approver"]),
          "vic": ("tok-vic", ["viewer"]), "olga": ("tok-olga", ["operator"]),
          "ada": ("tok-ada", ["admin"])}


class Served:
    """A running ``interlock serve`` subprocess."""

    def __init__(self, root: Path, *args: str, store: str | None = None,
                 wrap: tuple[str, ...] = ()) -> None:
        self.root = root
        self.proc = subprocess.Popen(  # wrap: a command that execs the server (prlimit)
            [*wrap, sys.executable, "-m", "interlock", "serve", "--port", "0", "--store",
             store or f"sqlite:///{root / 'runs.db'}", "--workflows", "flows", *args],
            cwd=root, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
            env={**os.environ, "PYTHONPATH": pythonpath(root)})
        self.lines: list[str] = []
        ready = threading.Event()
        self.port = 0

        def read() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                self.lines.append(line)
                m = re.search(r"Uvicorn running on http://127\.0\.0\.1:(\d+)", line)
                if m:
                    self.port = int(m.group(1))
                    ready.set()
            ready.set()

        self.reader = threading.Thread(target=read, daemon=True)
        self.reader.start()
        ready.wait(30)
        if not self.port:
            self.stop()
            raise AssertionError("the server did not start:\n" + "".join(self.lines))
        self.url = f"http://127.0.0.1:{self.port}"

    def client(self, token: str | None = None) -> Any:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(30)
        self.reader.join(10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        return code


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("INTERLOCK_STORE", raising=False)
    monkeypatch.delenv("INTERLOCK_LOG_KEY", raising=False)
    return write_folder(tmp_path, {"snodes": NODES}, {"gated": GATED, "slow": SLOW}, TOKENS)


@pytest.fixture
def serve(project: Path) -> Iterator[Any]:
    started: list[Served] = []

    def start(*args: str, store: str | None = None) -> Served:
        started.append(Served(project, *args, store=store))
        return started[-1]

    yield start
    for s in started:
        s.stop()


def events(client: Any, run_id: str, *, headers: dict[str, str] | None = None,
           params: dict[str, Any] | None = None, until: str | None = None
           ) -> Iterator[dict[str, Any]]:
    """The stream's events as ``{"event", "id", "data"}``; stops after ``until``."""
    with client.stream("GET", f"/api/runs/{run_id}/events", headers=headers or {},
                       params=params or {}) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        event: dict[str, Any] = {}
        for line in response.iter_lines():
            if line.startswith(":"):
                continue
            if not line:
                if event:
                    yield event
                    if event["event"] == until:
                        return
                event = {}
                continue
            key, _, value = line.partition(": ")
            event[key] = json.loads(value) if key == "data" else value


def wait_status(client: Any, run_id: str, status: str) -> dict[str, Any]:
    """Follow the run's events until its status is ``status`` (no sleeping)."""
    run: dict[str, Any] = client.get(f"/api/runs/{run_id}").json()
    if run["status"] == status:
        return run
    want = {"WAITING_APPROVAL": "run.waiting", "WAITING_INPUT": "run.waiting",
            "COMPLETED": "run.completed"}[status]
    for _ in events(client, run_id, params={"after": 0}, until=want):
        pass
    run = client.get(f"/api/runs/{run_id}").json()
    assert run["status"] == status, run
    return run


# -- runs over HTTP, the event stream ---------------------------------------------------


def test_a_run_started_over_http_streams_its_records_live_to_the_gate_and_on(
        serve: Any) -> None:
    server = serve()
    with server.client() as c:
        r = c.post("/api/workflows/gated/runs", json={"input": {"n": 1}, "run_id": "r1"})
        assert r.status_code == 201, r.text
        assert r.json()["run_id"] == "r1"
        seen = []
        for ev in events(c, "r1", until="run.waiting"):
            seen.append(ev)
        assert seen[0]["event"] == "run.started"
        assert "approval.requested" in [e["event"] for e in seen]
        # approve, then the rest of the run arrives on a stream resumed where we left
        d = c.post("/api/runs/r1/decisions", json={"decision": "approve", "by": "alice"})
        assert d.status_code == 200, d.text
        rest = list(events(c, "r1", headers={"Last-Event-ID": seen[-1]["id"]}))
        assert rest[-1]["event"] == "run.completed"  # and the stream closed after it
        ids = [int(e["id"]) for e in seen + rest]
        assert ids == list(range(1, len(ids) + 1))  # no gap, no duplicate
        records = c.get("/api/runs/r1/records").json()
        assert [r["seq"] for r in records] == ids
        assert [e["data"] for e in seen + rest] == records
        assert all(e["event"] == e["data"]["type"] for e in seen + rest)
        run = c.get("/api/runs/r1").json()
        assert run["status"] == "COMPLETED" and run["state"]["last"] == 4
        metrics = c.get("/metrics").text
        assert 'interlock_runs{status="COMPLETED",workflow="gated"} 1.0' in metrics
        assert 'interlock_node_attempts_total{node="last",outcome="completed",' \
               'workflow="gated"} 1.0' in metrics
        assert set(run) == {"run_id", "workflow", "status", "state", "steps", "tokens",
                            "error", "waiting"}


def test_a_stream_resumed_mid_run_gets_exactly_the_missing_records(serve: Any) -> None:
    server = serve()
    with server.client() as c:
        c.post("/api/workflows/gated/runs", json={"input": {"n": 1}, "run_id": "r2"})
        wait_status(c, "r2", "WAITING_APPROVAL")
        first = []
        for ev in events(c, "r2"):
            first.append(ev)
            if len(first) == 3:
                break  # the client goes away mid-stream
        # ?after= and Last-Event-ID (which wins: it is what a reconnecting browser sends)
        by_query = list(events(c, "r2", params={"after": 3}, until="run.waiting"))
        by_header = list(events(c, "r2", params={"after": 0},
                                headers={"Last-Event-ID": "3"}, until="run.waiting"))
        assert [e["id"] for e in by_query] == [e["id"] for e in by_header]
        assert [int(e["id"]) for e in first + by_query] == \
            list(range(1, int(by_query[-1]["id"]) + 1))


def test_a_run_started_by_the_cli_in_another_process_shows_on_the_stream(
        serve: Any, project: Path) -> None:
    server = serve()
    store = f"sqlite:///{project / 'runs.db'}"
    cli = [sys.executable, "-m", "interlock"]
    env = {**os.environ, "PYTHONPATH": pythonpath(project)}
    done = subprocess.run([*cli, "run", "flows/gated.yaml", "--input", '{"n": 5}',
                           "--run-id", "cli1", "--store", store], cwd=project, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 3, done.stderr  # waiting for approval
    with server.client() as c:
        got: list[dict[str, Any]] = []
        stream = events(c, "cli1")
        for ev in stream:
            got.append(ev)
            if ev["event"] == "run.waiting":
                break
        # decided by the CLI too, in yet another process: the stream, still open, sees it
        decider = subprocess.Popen([*cli, "resume", "cli1", "--approve", "--by", "alice",
                                    "--store", store], cwd=project, env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for ev in events(c, "cli1", headers={"Last-Event-ID": got[-1]["id"]}):
            got.append(ev)
        assert decider.wait(30) == 0
        types = [e["event"] for e in got]
        assert types[-1] == "run.completed"
        assert "approval.decided" in types
        assert [int(e["id"]) for e in got] == list(range(1, len(got) + 1))
        decided = next(e for e in got if e["event"] == "approval.decided")
        assert decided["data"]["by"] == "alice"


def test_starting_the_same_run_id_twice(serve: Any) -> None:
    server = serve()
    with server.client() as c:
        body = {"input": {"n": 1}, "run_id": "same"}
        assert c.post("/api/workflows/gated/runs", json=body).status_code == 201
        again = c.post("/api/workflows/gated/runs", json=body)
        assert again.status_code == 200 and again.json()["run_id"] == "same"
        other = c.post("/api/workflows/gated/runs", json={**body, "input": {"n": 2}})
        assert other.status_code == 409
        assert other.headers["content-type"] == "application/problem+json"
        assert other.json()["status"] == 409


def test_errors_are_problem_json_and_change_nothing(serve: Any, project: Path) -> None:
    server = serve()
    with server.client() as c:
        cases = [
            (c.get("/api/runs/nope"), 404, "no run 'nope'"),
            (c.post("/api/workflows/nope/runs", json={}), 404, "no workflow 'nope'"),
            (c.post("/api/workflows/gated/runs", json={"input": {}}), 400, "lacks 'n'"),
            (c.post("/api/workflows/gated/runs", content=b"[1",
                    headers={"content-type": "application/json"}), 422, "JSON"),
            (c.post("/api/workflows/gated/runs", json={"input": 3}), 422, "input"),
        ]
        for response, status, words in cases:
            assert response.status_code == status, response.text
            assert response.headers["content-type"] == "application/problem+json"
            body = response.json()
            # (a run not found names it too, in the extension member run_id)
            assert set(body) - {"run_id"} == {"type", "title", "status", "detail"}
            assert words in body["detail"]
        too_big = c.post("/api/workflows/gated/runs", content=b" " * (5 * 2**20),
                         headers={"content-type": "application/json"})
        assert too_big.status_code == 413
        assert "INTERLOCK_MAX_INPUT_BYTES" in too_big.json()["detail"]
        assert c.get("/api/runs").json() == {"runs": [], "next": None}
        assert c.get("/openapi.json").json()["paths"]["/api/runs/{run_id}/events"]


# -- decisions ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_of_two_concurrent_decisions_exactly_one_wins(serve: Any, project: Path,
                                                      kind: str) -> None:
    stores = store_urls(project)  # SQLite, and PostgreSQL when the tests have one
    if kind == "postgres" and len(stores) < 2:
        pytest.skip("INTERLOCK_TEST_POSTGRES is not set")
    # (a shared PostgreSQL may hold other tests' runs: this server takes none over)
    server = serve("--workers", "4", "--no-take-over", store=stores[kind == "postgres"])
    prefix = f"race-{os.getpid()}-{os.urandom(3).hex()}"
    with server.client() as c, ThreadPoolExecutor(2) as pool:
        for trial in range(20):
            rid = f"{prefix}-{trial}"
            c.post("/api/workflows/gated/runs", json={"input": {"n": trial}, "run_id": rid})
            wait_status(c, rid, "WAITING_APPROVAL")
            kinds = ["approve", "reject"]

            def decide(kind: str, rid: str = rid) -> Any:
                with server.client() as own:
                    return own.post(f"/api/runs/{rid}/decisions",
                                    json={"decision": kind, "by": "alice"})

            answers = list(pool.map(decide, kinds))
            codes = sorted(a.status_code for a in answers)
            assert codes == [200, 409], [a.text for a in answers]
            loser = next(a for a in answers if a.status_code == 409).json()
            assert "refused" in loser["detail"] or "executed by" in loser["detail"]
            records = c.get(f"/api/runs/{rid}/records").json()
            assert [r["type"] for r in records].count("approval.decided") == 1


# -- auth ----------------------------------------------------------------------------------


def test_auth_refusals_are_401_or_403_and_record_nothing(serve: Any) -> None:
    server = serve("--auth", "auth.yaml")
    tok = {n: t for n, (t, _) in TOKENS.items()}
    with server.client(tok["olga"]) as operator:
        r = operator.post("/api/workflows/gated/runs", json={"input": {"n": 1},
                                                             "run_id": "a1"})
        assert r.status_code == 201, r.text
        wait_status(operator, "a1", "WAITING_APPROVAL")
        count = len(operator.get("/api/runs/a1/records").json())
    body = {"decision": "approve", "by": "mallory"}
    with server.client() as anonymous, server.client("wrong") as wrong, \
            server.client(tok["vic"]) as viewer, server.client(tok["bob"]) as bob, \
            server.client(tok["olga"]) as operator:
        refusals = {
            "no token": (anonymous.post("/api/runs/a1/decisions", json=body), 401),
            "no token, reading": (anonymous.get("/api/runs/a1"), 401),
            "wrong token": (wrong.post("/api/runs/a1/decisions", json=body), 401),
            "viewer deciding": (viewer.post("/api/runs/a1/decisions", json=body), 403),
            "viewer starting": (viewer.post("/api/workflows/gated/runs",
                                            json={"input": {"n": 1}}), 403),
            "operator deciding": (operator.post("/api/runs/a1/decisions", json=body), 403),
            "approver not in approvers": (bob.post("/api/runs/a1/decisions", json=body),
                                          403),
        }
        for what, (response, status) in refusals.items():
            assert response.status_code == status, (what, response.text)
            assert response.headers["content-type"] == "application/problem+json", what
        assert refusals["no token"][0].headers["www-authenticate"].startswith("Bearer")
        assert "approvers are: alice, role:admin" in \
            refusals["approver not in approvers"][0].json()["detail"]
        assert viewer.get("/api/runs/a1").status_code == 200  # a viewer reads
        assert len(viewer.get("/api/runs/a1/records").json()) == count  # nothing recorded
    with server.client(tok["alice"]) as alice:
        ok = alice.post("/api/runs/a1/decisions", json=body)
        assert ok.status_code == 200, ok.text
        assert ok.json()["state"]["gate"]["by"] == "alice"  # the token's name, not the body's
        decided = [r for r in alice.get("/api/runs/a1/records").json()
                   if r["type"] == "approval.decided"]
        assert [d["by"] for d in decided] == ["alice"]
    with server.client(tok["olga"]) as operator, server.client(tok["ada"]) as admin:
        operator.post("/api/workflows/gated/runs", json={"input": {"n": 1}, "run_id": "a2"})
        wait_status(operator, "a2", "WAITING_APPROVAL")
        # role:admin is in approvers: ada decides by her role
        assert admin.post("/api/runs/a2/decisions",
                          json={"decision": "reject"}).status_code == 200


def test_serving_beyond_loopback_without_auth_is_refused(project: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "interlock", "serve", "--host", "0.0.0.0",
                           "--port", "0", "--workflows", "flows"], cwd=project,
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": pythonpath(project)})
    assert done.returncode == 2
    assert "not a loopback address, without --auth" in done.stderr


# -- notifications -------------------------------------------------------------------------


class _Receiver(http.server.BaseHTTPRequestHandler):
    answers: ClassVar[list[int]] = []
    bodies: ClassVar[list[dict[str, Any]]] = []
    got = threading.Event()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).bodies.append(json.loads(body))
        code = type(self).answers.pop(0) if type(self).answers else 200
        self.send_response(code)
        self.end_headers()
        if code == 200:
            type(self).got.set()

    def log_message(self, *args: Any) -> None:
        pass


def test_a_notification_is_retried_and_each_attempt_is_in_the_log(serve: Any) -> None:
    _Receiver.answers, _Receiver.bodies = [500], []
    _Receiver.got.clear()
    receiver = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    try:
        hook = f"http://127.0.0.1:{receiver.server_address[1]}/hook"
        server = serve("--notify", hook, "--public-url", "http://inbox.example")
        with server.client() as c:
            c.post("/api/workflows/gated/runs", json={"input": {"n": 1}, "run_id": "n1"})
            assert _Receiver.got.wait(30)
            # the second attempt's record follows its delivery: follow the log to it
            sent: list[dict[str, Any]] = []
            for ev in events(c, "n1"):
                if ev["event"] == "notify.sent":
                    sent.append(ev["data"])
                    if len(sent) == 2:
                        break
        origin = f"http://127.0.0.1:{receiver.server_address[1]}"  # never the path
        assert [(s["url"], s["notify"], s["attempt"], s.get("status")) for s in sent] == \
            [(origin, 1, 1, 500), (origin, 1, 2, 200)]
        message = _Receiver.bodies[-1]
        assert "gated" in message["text"] and "n1" in message["text"]
        assert "http://inbox.example/approvals?run_id=n1" in json.dumps(message["blocks"])
        with server.client() as c:  # the notes changed nothing: the run still waits
            assert c.get("/api/runs/n1").json()["status"] == "WAITING_APPROVAL"
            assert c.post("/api/runs/n1/decisions",
                          json={"decision": "approve", "by": "alice"}).status_code == 200
    finally:
        receiver.shutdown()
        receiver.server_close()


def test_a_gate_of_a_run_the_cli_executes_is_announced_too(serve: Any,
                                                            project: Path) -> None:
    _Receiver.answers, _Receiver.bodies = [], []
    _Receiver.got.clear()
    receiver = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    try:
        hook = f"http://127.0.0.1:{receiver.server_address[1]}/hook"
        server = serve("--notify", hook)
        done = subprocess.run(
            [sys.executable, "-m", "interlock", "run", "flows/gated.yaml", "--input",
             '{"n": 2}', "--run-id", "cli-n", "--store", f"sqlite:///{project / 'runs.db'}"],
            cwd=project, env={**os.environ, "PYTHONPATH": pythonpath(project)},
            capture_output=True, text=True)
        assert done.returncode == 3, done.stderr
        assert _Receiver.got.wait(30)  # found among the waiting runs of the store
        assert "cli-n" in _Receiver.bodies[0]["text"]
        with server.client() as c:
            sent = next(ev["data"] for ev in events(c, "cli-n")
                        if ev["event"] == "notify.sent")
            requested = next(r for r in c.get("/api/runs/cli-n/records").json()
                             if r["type"] == "approval.requested")
        assert (sent["url"], sent["attempt"], sent["status"], sent["request"]) == \
            (hook.removesuffix("/hook"), 1, 200, requested["seq"])
    finally:
        receiver.shutdown()
        receiver.server_close()


# -- SIGTERM, takeover ---------------------------------------------------------------------


def test_sigterm_drains_and_the_next_start_takes_the_run_over(serve: Any,
                                                             project: Path) -> None:
    server = serve("--drain", "0.5")
    with server.client() as c:
        assert c.post("/api/workflows/slow/runs", json={"run_id": "s1"}).status_code == 201
        for ev in events(c, "s1"):
            if ev["event"] == "node.started":
                break  # committed by the watcher: the node is running
    # uvicorn re-raises the signal once it has shut down: the process ends by SIGTERM
    assert server.stop() in (0, -signal.SIGTERM), "".join(server.lines)
    assert "stopped 1 execution(s) still running" in "".join(server.lines)
    with sqlite3.connect(project / "runs.db") as db:
        owner, status = db.execute("SELECT owner, status FROM runs WHERE run_id = 's1'"
                                   ).fetchone()
    assert owner is None  # no lease left behind
    assert status == "RUNNING"
    (project / "slow.release").write_text("")
    again = serve()
    with again.client() as c:
        run = wait_status(c, "s1", "COMPLETED")
        assert run["state"]["slow"] is True
        types = [r["type"] for r in c.get("/api/runs/s1/records").json()]
        assert "run.resumed" in types


# -- the CLI against a server --------------------------------------------------------------


def _ages(text: str) -> str:
    return re.sub(r"\b\d+(\.\d+)?(ms|s|m|h|d)\b", "AGE", text)


def test_the_cli_gives_the_same_output_and_exit_codes_through_a_server(
        serve: Any, project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from interlock.cli import cli

    server = serve("--auth", "auth.yaml")
    store = f"sqlite:///{project / 'runs.db'}"
    monkeypatch.chdir(project)

    def local(*args: str) -> Any:
        return CliRunner().invoke(cli, [*args, "--store", store], catch_exceptions=False)

    def remote(*args: str, token: str = "tok-ada") -> Any:
        return CliRunner().invoke(cli, list(args), catch_exceptions=False,
                                  env={"INTERLOCK_SERVER": server.url,
                                       "INTERLOCK_TOKEN": token})

    with server.client("tok-olga") as c:
        c.post("/api/workflows/gated/runs", json={"input": {"n": 1}, "run_id": "c1"})
        wait_status(c, "c1", "WAITING_APPROVAL")
    for args in (["status", "c1", "--json"], ["trace", "c1", "--json"],
                 ["runs", "--json"], ["status", "c1"], ["runs"]):
        here, there = local(*args), remote(*args)
        # (the local hints to decide name the store: `interlock resume ... --store URL`)
        expected = here.stdout.replace(f" --store {store}", "")
        # (and ages -- "waiting for 1s", "3s ago" -- may tick between the two)
        assert (there.exit_code, _ages(there.stdout)) == (here.exit_code, _ages(expected)), \
            args
    assert remote("status", "c1").exit_code == 3
    trace_here, trace_there = local("trace", "c1"), remote("trace", "c1")
    assert trace_there.stdout.splitlines()[0] == trace_here.stdout.splitlines()[0]
    # a refused decision: exit 2 with the server's message; the token's role decides
    refused = remote("resume", "c1", "--approve", token="tok-bob")
    assert refused.exit_code == 2
    assert "'bob' may not decide 'gate'" in refused.stderr
    assert remote("status", "c1", token="wrong").exit_code == 2
    decided = remote("resume", "c1", "--approve", "--json", token="tok-alice")
    assert decided.exit_code == 0, decided.stderr
    result = json.loads(decided.stdout)
    assert result["status"] == "COMPLETED" and result["state"]["gate"]["by"] == "alice"
    assert json.loads(local("status", "c1", "--json").stdout) == result
    again = remote("resume", "c1", "--approve", token="tok-alice")
    assert again.exit_code == 2 and "not waiting for a decision" in again.stderr
    assert remote("status", "nope").exit_code == 2
    both = CliRunner().invoke(cli, ["status", "c1", "--store", store],
                              env={"INTERLOCK_SERVER": server.url})
    assert both.exit_code == 2 and "not both" in both.stderr
    with server.client("tok-olga") as c:
        c.post("/api/workflows/gated/runs", json={"input": {"n": 1}, "run_id": "c2"})
        wait_status(c, "c2", "WAITING_APPROVAL")
    cancelled = remote("cancel", "c2", token="tok-olga")
    assert cancelled.exit_code == 0 and cancelled.stdout.startswith("cancelled: c2")
    assert json.loads(local("status", "c2", "--json").stdout)["status"] == "CANCELLED"


def test_a_server_killed_mid_run_is_taken_over_on_restart(serve: Any, project: Path) -> None:
    """kill -9: no drain, the claim is left behind; the next start sees its owner is
    gone and continues the run from its log, running nothing completed again."""
    server = serve()
    with server.client() as c:
        assert c.post("/api/workflows/slow/runs", json={"run_id": "k1"}).status_code == 201
        for ev in events(c, "k1"):
            if ev["event"] == "node.started" and ev["data"]["node"] == "slow":
                break
    server.proc.kill()
    server.stop()
    with sqlite3.connect(project / "runs.db") as db:
        (owner,) = db.execute("SELECT owner FROM runs WHERE run_id = 'k1'").fetchone()
    assert owner is not None and f":{server.proc.pid}:" in owner  # left behind
    (project / "slow.release").write_text("")
    again = serve()
    with again.client() as c:
        run = wait_status(c, "k1", "COMPLETED")
    assert run["state"] == {"counted": True, "slow": True}
    # counted completed before the kill: not run again; slow had only started
    assert (project / "executions.log").read_text().split() == ["counted", "slow", "slow"]


def test_the_app_mounts_in_another_fastapi_app(project: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/server.md's embedding: the host app takes interlock's lifespan."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from interlock.server import ServerOptions, create_app

    monkeypatch.chdir(project)
    monkeypatch.syspath_prepend(str(project))
    engine = create_app(ServerOptions(store="memory://", workflows=["flows/gated.yaml"]))
    app = FastAPI(lifespan=engine.router.lifespan_context)
    app.mount("/interlock", engine)
    with TestClient(app, base_url="http://127.0.0.1") as c:
        assert c.get("/interlock/api/health").json()["status"] == "ok"
        r = c.post("/interlock/api/workflows/gated/runs", json={"input": {"n": 1},
                                                                "run_id": "m1"})
        assert r.status_code == 201
        with c.stream("GET", "/interlock/api/runs/m1/events") as stream:
            for line in stream.iter_lines():
                if line == "event: run.waiting":
                    break
        # without --auth a decision is by `local` unless the body names someone, and
        # approvers: still applies to that name
        anonymous = c.post("/interlock/api/runs/m1/decisions", json={"decision": "approve"})
        assert anonymous.status_code == 403
        assert "'local' may not decide 'gate'" in anonymous.json()["detail"]
        d = c.post("/interlock/api/runs/m1/decisions",
                   json={"decision": "approve", "by": "alice"})
        assert d.status_code == 200 and d.json()["state"]["gate"]["by"] == "alice"


def test_metrics_are_prometheus_text_after_a_known_workload(serve: Any) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    server = serve()
    with server.client() as c:
        for k in range(2):
            r = c.post("/api/workflows/gated/runs", json={"input": {"n": 1}, "run_id": f"m{k}"})
            assert r.status_code == 201, r.text
            wait_status(c, f"m{k}", "WAITING_APPROVAL")
        d = c.post("/api/runs/m0/decisions", json={"decision": "approve", "by": "alice"})
        assert d.status_code == 200, d.text
        wait_status(c, "m0", "COMPLETED")
        response = c.get("/metrics")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain")
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for family in text_string_to_metric_families(response.text)
           for s in family.samples}
    assert got[("interlock_runs", (("status", "COMPLETED"), ("workflow", "gated")))] == 1
    assert got[("interlock_runs", (("status", "WAITING_APPROVAL"), ("workflow", "gated")))] == 1
    assert got[("interlock_approvals_pending", (("workflow", "gated"),))] == 1
    assert got[("interlock_approval_oldest_age_seconds", (("workflow", "gated"),))] >= 0
    completed = [v for (name, labels), v in got.items()
                 if name == "interlock_node_attempts_total" and ("outcome", "completed") in labels]
    assert sum(completed) >= 3  # the nodes of two runs up to their gates, and m0's rest
    assert any(name == "interlock_node_duration_seconds_bucket" for name, _ in got)
