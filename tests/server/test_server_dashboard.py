"""What the dashboard reads from the server, without a browser: its pages and files (and
their headers), a run's graph and node visits, what a gate's modify accepts, who a token
is -- against a real server (tests/server/test_server.py's). And the patch schema the page
checks a modify against agrees with the engine's own check of a patch."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import test_server
from hypothesis import given, settings
from hypothesis import strategies as st
from test_server import TOKENS, wait_status

import interlock
from interlock._engine._approvals import check_patch, schema_problems
from interlock.support import parse_definition, patch_schema

pytest.importorskip("fastapi")
project, serve = test_server.project, test_server.serve  # its fixtures, used here too


def test_the_pages_and_files_need_no_token_and_forbid_other_origins(serve: Any) -> None:
    server = serve("--auth", "auth.yaml")
    with server.client() as c:
        for path in ("/", "/approvals", "/runs/any-id", "/workflows", "/workflows/gated"):
            r = c.get(path)
            assert r.status_code == 200, path
            assert r.headers["content-type"].startswith("text/html")
            assert '<script type="module" src="/ui/app.js">' in r.text
            csp = r.headers["content-security-policy"]
            assert "default-src 'none'" in csp and "script-src 'self'" in csp
            assert "connect-src 'self'" in csp and "frame-ancestors 'none'" in csp
        for name, kind in [("app.js", "text/javascript"), ("api.js", "text/javascript"),
                           ("graph.js", "text/javascript"), ("schema.js", "text/javascript"),
                           ("style.css", "text/css")]:
            r = c.get(f"/ui/{name}")
            assert r.status_code == 200 and r.headers["content-type"].startswith(kind), name
            assert r.headers["x-content-type-options"] == "nosniff"
        assert c.get("/ui/../_app.py").status_code == 404
        assert c.get("/ui/%2e%2e/_app.py").status_code == 404
        assert c.get("/api/runs").status_code == 401  # the data still needs one
        me = c.get("/api/me")
        assert me.status_code == 401
        me = c.get("/api/me", headers={"Authorization": f"Bearer {TOKENS['vic'][0]}"})
        assert me.json() == {"name": "vic", "roles": ["viewer"], "authenticated": True}


def test_a_runs_graph_visits_and_its_gates_modify(serve: Any) -> None:
    server = serve()
    with server.client() as c:
        assert c.get("/api/me").json() == {"name": "local", "roles": ["admin"],
                                           "authenticated": False}
        r = c.post("/api/workflows/gated/runs", json={"input": {"n": 1}, "run_id": "g1"})
        assert r.status_code == 201, r.text
        wait_status(c, "g1", "WAITING_APPROVAL")
        graph = c.get("/api/runs/g1/graph").json()
        assert graph == c.get("/api/workflows/gated").json()["graph"]
        assert [e["from"] for e in graph["edges"]] == [["START"], ["first"], ["gate"],
                                                      ["last"]]
        assert c.get("/api/runs/nope/graph").status_code == 404

        gate = next(g for g in c.get("/api/approvals").json() if g["run_id"] == "g1")
        assert gate["kind"] == "approval" and gate["input"] is None
        assert gate["decisions"] == ["approve", "reject", "modify"]
        modify = gate["modify"]
        assert modify["at"] == ["first"]
        schema = modify["patch_schema"]
        assert schema["additionalProperties"] is False and schema["minProperties"] == 1
        assert set(schema["properties"]) == {"n", "first", "gate"}  # declared, or in the state

        # what the page's check cannot see (a number beyond 64 bits): the server's 400
        big = c.post("/api/runs/g1/decisions", content=b'{"decision": "modify", "by": "alice",'
                     b' "patch": {"first": 100000000000000000000}}',
                     headers={"content-type": "application/json"})
        assert big.status_code == 400 and "64-bit" in big.json()["detail"], big.text
        d = c.post("/api/runs/g1/decisions", json={"decision": "approve", "by": "alice"})
        assert d.status_code == 200, d.text
        wait_status(c, "g1", "COMPLETED")
        visits = {v["node"]: v for v in c.get("/api/runs/g1/visits").json()}
    assert list(visits) == ["first", "gate", "last"]
    first, gate_visit, last = visits["first"], visits["gate"], visits["last"]
    assert first["input"] == {"n": 1}  # no reads: declared: the whole state
    assert first["update"] == {"first": 2} and first["status"] == "completed"
    assert first["duration_ms"] is not None and first["attempts"] == 1
    assert gate_visit["input"] == {"first": 2}  # what it shows
    assert gate_visit["decision"] == "approved"
    assert last["input"] == {"n": 1, "first": 2, "gate": last["input"]["gate"]}
    assert last["update"] == {"last": 4}
    assert all(v["seqs"] == sorted(v["seqs"]) for v in visits.values())


def test_a_visits_input_is_what_it_reads_as_the_fold_has_it(tmp_path: Any) -> None:
    """Reducers, parallel branches and a retry: each visit's input is the state it read."""
    import asyncio

    calls: dict[str, int] = {}

    def a(state: dict[str, Any]) -> dict[str, Any]:
        return {"log": "a", "x": 1}

    def b(state: dict[str, Any]) -> dict[str, Any]:
        calls["b"] = calls.get("b", 0) + 1
        if calls["b"] == 1:
            raise ConnectionError("flaky")
        return {"log": "b"}

    def c(state: dict[str, Any]) -> dict[str, Any]:
        return {"seen": len(state["log"])}

    wf = interlock.Workflow("v", input=["x0"], state={"log": {"reducer": "append"}})
    wf.node("a", a, writes=["log", "x"])
    wf.node("b", b, reads=["log"], writes=["log"],
            retry={"attempts": 2, "backoff": 0.0, "errors": ["ConnectionError"]})
    wf.node("c", c, reads=["log", "x"], writes=["seen"])
    wf.edge("START", "a")
    wf.edge("a", "b")
    wf.edge("b", "c")
    wf.edge("c", "END")
    store = f"sqlite:///{tmp_path / 'v.db'}"
    from interlock.support import node_visits

    async def go() -> list[dict[str, Any]]:
        result = await wf.run({"x0": 0}, store=store, run_id="v1")
        assert result.status == "COMPLETED"
        return await node_visits("v1", store=store)

    visits = {v["node"]: v for v in asyncio.run(go())}
    assert visits["a"]["input"] == {"x0": 0, "log": []}
    assert visits["b"]["input"] == {"log": ["a"]}
    assert visits["b"]["attempts"] == 2 and visits["b"]["status"] == "completed"
    assert visits["b"]["error"] is None  # the retry succeeded
    assert visits["c"]["input"] == {"log": ["a", "b"], "x": 1}


def test_a_mapped_items_input_has_its_item(tmp_path: Any, monkeypatch: Any) -> None:
    import asyncio

    (tmp_path / "mnodes.py").write_text("def f(state):\n    return {'out': {state['s']: 1}}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "m.yaml").write_text(
        "workflow: m\ninput: [xs]\nstate:\n  out: {reducer: merge}\n"
        "nodes:\n  f: {call: mnodes:f, reads: [xs, s], writes: [out]}\n"
        "edges:\n  - {from: START, map: xs, to: f, as: s}\n  - {from: f, to: END}\n")
    from interlock.support import node_visits

    store = f"sqlite:///{tmp_path / 'm.db'}"

    async def go() -> list[dict[str, Any]]:
        wf = interlock.load(tmp_path / "m.yaml")
        assert (await wf.run({"xs": ["a", "b"]}, store=store, run_id="m1")).status == \
            "COMPLETED"
        return await node_visits("m1", store=store)

    items = {v["item"]: v for v in asyncio.run(go()) if v["item"] is not None}
    assert items[0]["input"] == {"xs": ["a", "b"], "s": "a"}
    assert items[1]["input"] == {"xs": ["a", "b"], "s": "b"}
    assert items[1]["update"] == {"out": {"b": 1}}


SPEC = parse_definition({
    "workflow": "p", "input": ["n"],
    "state": {"log": {"reducer": "append"}, "bag": {"reducer": "merge"},
              "total": {"reducer": "add"}, "plain": {}},
    "nodes": {"w": {"call": "m:f", "writes": ["out"]},
              "gate": {"approval": {"show": ["out"], "on_modify": ["w"]}}},
    "edges": [{"from": "START", "to": "w"}, {"from": "w", "to": "gate"},
              {"from": "gate", "to": "END"}]})
FIELDS = ["n", "log", "bag", "total", "plain", "out", "gate", "extra", "nope"]
VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63 - 1),
                   st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=3),
                   st.lists(st.integers(-9, 9), max_size=2),
                   st.dictionaries(st.text(max_size=2), st.integers(-9, 9), max_size=2))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=3))
def test_the_patch_schema_accepts_exactly_what_check_patch_accepts(patch: dict[str, Any]
                                                                   ) -> None:
    state = {"n": 1, "extra": 2, "log": []}  # "extra": a field the run's state has
    schema = patch_schema(SPEC, state)
    by_schema = schema_problems(schema, patch) == ""
    try:
        check_patch(SPEC, SimpleNamespace(state=state), patch)  # type: ignore[arg-type]
        by_engine = True
    except interlock.UsageError:
        by_engine = False
    by_engine = by_engine and bool(patch)  # modify refuses an empty patch before this check
    assert by_schema == by_engine, (patch, schema_problems(schema, patch))
