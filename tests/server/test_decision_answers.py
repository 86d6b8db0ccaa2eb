"""The decisions endpoint's answers say what is wrong with the request (review 40, finding
5): a ``node`` the workflow has not (or that is no gate) is the request's mistake (422,
not a 409 state conflict); an item index out of a mapped gate's range says which items
wait (no "did you mean" another item); an unknown run names the server's own list of runs
-- on the API and through ``--server`` -- not a local store's ``interlock runs``.

A real server on loopback, a real SQLite store.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from _harness import problem as _problem
from _harness import serve, started_waiting
from click.testing import CliRunner
from conftest import CliProject
from test_parallel_gates import MAPPED, MAPPED_NODES

from interlock.cli import cli


@pytest.fixture
def served(make_project: Callable[..., CliProject]) -> object:
    p = make_project(MAPPED_NODES)
    server = serve(p, deploys=MAPPED)
    try:
        with server.client() as http:
            started_waiting(http, "deploys", "da-1")
            # items 0..4 asked; 0 decided: 1..4 wait
            http.post("/api/runs/da-1/decisions", json={
                "decision": "approve", "node": "deploy[0]"}).raise_for_status()
        yield server
    finally:
        server.stop()


def test_a_node_the_workflow_has_not_is_a_422_with_the_same_words(served: object) -> None:
    with served.client() as http:  # type: ignore[attr-defined]
        typo = _problem(http.post("/api/runs/da-1/decisions", json={
            "decision": "approve", "node": "deplyo", "by": "bob"}), 422)
        assert "workflow 'deploys' has no node 'deplyo'. Did you mean 'deploy" in typo
        assert '(decide one with "node": "NAME" in the request body)' in typo
        no_gate = _problem(http.post("/api/runs/da-1/decisions", json={
            "decision": "approve", "node": "plan"}), 422)
        assert "'plan' is not a gate" in no_gate
        # a state conflict stays one: decided already, a mapped gate's bare name
        again = _problem(http.post("/api/runs/da-1/decisions", json={
            "decision": "approve", "node": "deploy[0]"}), 409)
        assert "was decided already" in again
        _problem(http.post("/api/runs/da-1/decisions", json={
            "decision": "approve", "node": "deploy"}), 409)
        # the API's declared answers say so
        spec = http.get("/openapi.json").json()
        answers = spec["paths"]["/api/runs/{run_id}/decisions"]["post"]["responses"]
        assert "422" in answers and "409" in answers


def test_an_item_out_of_range_says_which_items_wait(served: object) -> None:
    with served.client() as http:  # type: ignore[attr-defined]
        out = _problem(http.post("/api/runs/da-1/decisions", json={
            "decision": "approve", "node": "deploy[9]"}), 409)
    assert "Did you mean" not in out
    assert "'deploy' is a mapped gate whose items asked are deploy[0]..deploy[4]; " \
        "'deploy[9]' is none of them" in out
    assert "Items 1\u20134 of 'deploy' wait." in out
    assert "Waiting: deploy[1], deploy[2], deploy[3], deploy[4]" in out


def test_an_unknown_run_names_the_servers_runs_not_a_local_store(served: object) -> None:
    url = served.url  # type: ignore[attr-defined]
    with served.client() as http:  # type: ignore[attr-defined]
        answer = http.post("/api/runs/nope/decisions", json={"decision": "approve"})
        detail = _problem(answer, 404)
    assert detail == (f"no run 'nope' in this server's store (list its runs with "
                      f"`interlock runs --server {url}`, or GET {url}/api/runs)")
    assert answer.json()["run_id"] == "nope"
    for args in (["verify", "nope"], ["status", "nope"],
                 ["resume", "nope", "--approve"]):
        said = CliRunner().invoke(cli, [*args, "--server", url])
        assert said.exit_code == 2, said.output
        assert (f"no run 'nope' in the store of the server at {url} (list its runs with "
                f"`interlock runs --server {url}`)") in said.output, args
