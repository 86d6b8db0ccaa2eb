"""The outcome of an action a person checked by hand (an unknown outcome approved with
``--data '{"result": {...}}'``) is recorded as the node's update, so it is checked as the
update its body would have returned: a field the node's ``writes:`` does not declare
(a typo typed during an incident) is refused -- exit 2 on the CLI, 400 from the API (a
decision the engine refuses, as a bad patch), nothing recorded -- naming the declared
writes and the nearest one; a field with a reducer takes that reducer's kind. The kill
is real: the node SIGKILLs its own process in the middle of the action, after it was
approved."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_server import Served, pythonpath

NODES = '''
import os, signal

def wipe(state):
    with open("wipe.log", "a") as f:
        f.write("wipe\\n")
    if os.path.exists("kill.me"):  # the process dies in the middle of the action
        os.remove("kill.me")
        os.kill(os.getpid(), signal.SIGKILL)
    return {"wiped": state["disk"]}
'''

FLOW = """
workflow: wipes
input: [disk]
state: {notes: {reducer: extend}}
nodes: {wipe: {call: "wnodes:wipe", confirm: true, reads: [disk], writes: [wiped, notes]}}
edges: [{from: START, to: wipe}, {from: wipe, to: END}]
"""


def interlock(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "interlock", *args, "--store",
                           f"sqlite:///{root / 'runs.db'}"], cwd=root, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": pythonpath(root)},
                          timeout=120)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store whose runs ``cli`` and ``api`` wait at the unknown outcome of ``wipe``."""
    for name in ("INTERLOCK_STORE", "INTERLOCK_LOG_KEY"):
        os.environ.pop(name, None)
    root = tmp_path_factory.mktemp("outcome_writes")
    (root / "wnodes.py").write_text(NODES)
    (root / "flows").mkdir()
    (root / "flows" / "wipes.yaml").write_text(FLOW)
    for run_id in ("cli", "api"):
        started = interlock(root, "run", "flows/wipes.yaml", "--run-id", run_id,
                            "--input", '{"disk": "sdq"}')
        assert started.returncode == 3, started.stderr
        (root / "kill.me").touch()
        assert interlock(root, "resume", run_id, "--approve", "--by", "al").returncode == -9
        assert interlock(root, "resume", run_id).returncode == 3
    return root


def records(root: Path, run_id: str) -> int:
    return len(json.loads(interlock(root, "trace", run_id, "--json").stdout))


def test_runs_waiting_offers_what_an_unknown_outcome_takes(root: Path) -> None:
    """`runs --waiting` listing only unknown outcomes: its footer offers what they take
    (approve, reject, approve with the outcome checked by hand), not --modify."""
    listed = interlock(root, "runs", "--waiting")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.count("wipe (OUTCOME UNKNOWN)") == 2, listed.stdout
    [footer] = [line for line in listed.stderr.splitlines() if line.startswith("decide with")]
    assert "--modify" not in footer and "a message" not in footer, footer
    assert "--gate GATE --approve --store" in footer, footer
    assert "(or --reject, or --approve --data '{\"result\": {\"FIELD\": \"VALUE\"}}')" \
        in footer, footer


def test_an_outcome_with_an_undeclared_field_is_refused_on_the_cli(root: Path) -> None:
    before = records(root, "cli")
    typo = interlock(root, "resume", "cli", "--gate", "wipe", "--approve", "--by", "al",
                     "--data", '{"result": {"wipde": "sdq"}}')
    assert typo.returncode == 2, typo.stderr
    assert "'wipde' (did you mean 'wiped'?)" in typo.stderr
    assert "writes: are [notes, wiped]" in typo.stderr
    assert "nothing was recorded" in typo.stderr
    reducer = interlock(root, "resume", "cli", "--gate", "wipe", "--approve", "--by", "al",
                        "--data", '{"result": {"notes": "not a list"}}')
    assert reducer.returncode == 2, reducer.stderr
    assert "reducer 'extend' and takes a list" in reducer.stderr
    assert records(root, "cli") == before  # neither was recorded
    done = interlock(root, "resume", "cli", "--gate", "wipe", "--approve", "--by", "al",
                     "--data", '{"result": {"wiped": "sdq"}}', "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["state"]["wiped"] == "sdq"
    assert (root / "wipe.log").read_text().count("wipe") == 2  # not run again


def test_an_outcome_with_an_undeclared_field_is_refused_by_the_api(root: Path) -> None:
    before = records(root, "api")
    served = Served(root)
    try:
        with served.client() as c:
            r = c.post("/api/runs/api/decisions", json={
                "decision": "approve", "node": "wipe", "by": "al",
                "data": {"result": {"wipde": "sdq"}}})
            assert r.status_code == 400, r.text  # refused by the engine, as a bad patch
            assert "did you mean 'wiped'?" in r.json()["detail"]
            assert records(root, "api") == before
            r = c.post("/api/runs/api/decisions", json={
                "decision": "approve", "node": "wipe", "by": "al",
                "data": {"result": {"wiped": "sdq"}}})
            assert r.status_code == 200, r.text
    finally:
        served.stop()
