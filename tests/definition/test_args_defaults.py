"""Node arguments and field defaults (SPEC §7): ``args:`` -> ``ctx.args``; a field with
a reducer starts empty (or at its ``default``), one without is absent unless it declares
a ``default``; a run's input replaces a default; the defaults a run started with are in
its log, so a resume folds the same state."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

import interlock
from interlock import START, Workflow, WorkflowError
from interlock.testing import ScriptedProvider

if TYPE_CHECKING:
    from conftest import CliProject

NODES = """
def fetch(state, ctx):
    return {"fetched": state.get("fetched", []) + [f"{ctx.args['source']}:{ctx.args['n']}"]}

def look(state):
    return {"saw": {k: state.get(k, "absent") for k in ("history", "n", "meta", "note",
                                                        "flag")},
            "history": "looked"}
"""


def test_one_function_serves_several_nodes_through_args(
        make_project: Callable[..., CliProject]) -> None:
    p = make_project(NODES)
    result, out = p.cli_json("run", p.workflow("""
        workflow: fetchers
        nodes:
          web: {call: {mod}:fetch, args: {source: web, n: 3}}
          db: {call: {mod}:fetch, args: {source: db, n: 1}}
          iso: {call: {mod}:fetch, args: {source: iso, n: 2}, isolation: process}
        edges:
          - {from: START, to: web}
          - {from: web, to: db}
          - {from: db, to: iso}
        """))
    assert result.exit_code == 0, result.output
    assert out["state"]["fetched"] == ["web:3", "db:1", "iso:2"]


def test_args_are_part_of_the_definition_and_the_builder_has_them() -> None:
    seen: list[Any] = []

    def fn(state: dict[str, Any], ctx: interlock.Context) -> None:
        seen.append(dict(ctx.args))
        with pytest.raises(TypeError):
            ctx.args["x"] = 2  # type: ignore[index]

    wf = Workflow("args")
    wf.node("a", fn, args={"x": 1}).node("b", fn)
    wf.edge(START, "a").edge("a", "b")
    assert wf.definition()["nodes"]["a"]["args"] == {"x": 1}
    assert "args" not in wf.definition()["nodes"]["b"]
    assert wf.run_sync(store="memory://").status == "COMPLETED"
    assert seen == [{"x": 1}, {}]


def test_args_on_a_node_without_a_function_are_refused() -> None:
    wf = Workflow("gate-args")
    wf.approval("ok", args={"x": 1})
    wf.edge(START, "ok")
    with pytest.raises(WorkflowError, match="no function to pass them to"):
        wf.compile()


DEFAULTS = """
    workflow: defaults
    state:
      history: append
      n: add
      meta: {{reducer: merge, default: {{owner: ops}}}}
      note: {{default: none yet}}
      flag: {{}}
    nodes:
      look: {mod}:look
    edges:
      - {{from: START, to: look, when: 'size(history) == 0 && n == 0 && meta.owner == "ops"'}}
    """


def test_fields_start_empty_or_at_their_default(make_project: Callable[..., CliProject]
                                                ) -> None:
    p = make_project(NODES)
    result, out = p.cli_json("run", p.workflow(DEFAULTS.replace("{{", "{").replace("}}", "}")),
                             "--run-id", "d1")
    assert result.exit_code == 0, result.output
    # a condition read them before any write; the node saw them; `flag` (no reducer, no
    # default) is absent until written
    assert out["state"]["saw"] == {"history": [], "n": 0, "meta": {"owner": "ops"},
                                   "note": "none yet", "flag": "absent"}
    assert out["state"]["history"] == ["looked"]
    [started] = [r for r in p.records("d1") if r["type"] == "run.started"]
    assert started["defaults"] == {"history": [], "n": 0, "meta": {"owner": "ops"},
                                   "note": "none yet"}
    assert p.cli("verify", "d1").exit_code == 0


def test_the_runs_input_replaces_a_default(make_project: Callable[..., CliProject]) -> None:
    p = make_project(NODES)
    wf = p.workflow(DEFAULTS.replace("{{", "{").replace("}}", "}").replace(
        "when: 'size(history) == 0 && n == 0 && meta.owner == \"ops\"'", ""))
    result, out = p.cli_json("run", wf, "--input", json.dumps(
        {"history": ["before"], "n": 5, "note": None, "meta": None}))
    assert result.exit_code == 0, result.output
    # null for a field with a reducer starts it empty (at its default); for one without,
    # null is the value
    assert out["state"]["saw"] == {"history": ["before"], "n": 5, "meta": {"owner": "ops"},
                                   "note": None, "flag": "absent"}


def test_a_template_reads_an_append_field_before_its_first_write() -> None:
    wf = Workflow("template", state={"history": "append"})
    wf.agent("writer", prompt="Earlier drafts: {{ history | length }}",
             provider=ScriptedProvider(["draft one"]), output_key="history")
    wf.edge(START, "writer")
    result = wf.run_sync(store="memory://")
    assert result.status == "COMPLETED", result.error
    assert result.state["history"] == ["draft one"]


@pytest.mark.parametrize("field, message", [
    ("{reducer: append, default: 3}", "the default is a list (e.g. []), not int"),
    ("{reducer: merge, default: [1]}", "the default is an object (e.g. {}), not list"),
    ("{reducer: add, default: true}", "the default is a number (e.g. 0), not bool"),
])
def test_a_default_that_does_not_fit_its_reducer_is_refused(
        make_project: Callable[..., CliProject], field: str, message: str) -> None:
    p = make_project(NODES)
    name = p.workflow(f"""
        workflow: bad-default
        state:
          f: {field}
        nodes:
          look: {{mod}}:look
        edges:
          - {{from: START, to: look}}
        """.replace("{{mod}}", "{mod}").replace("{{", "{").replace("}}", "}"))
    with pytest.raises(WorkflowError) as info:
        interlock.load(p.root / name)
    assert message in str(info.value) and "wf.yaml:4:" in str(info.value)


def test_a_declared_default_changes_the_hash_and_an_undeclared_one_does_not() -> None:
    plain = Workflow("h", state={"log": "append"}).node("a", lambda s: None).edge(START, "a")
    same = Workflow("h", state={"log": {"reducer": "append"}}).node(
        "a", lambda s: None).edge(START, "a")
    declared = Workflow("h", state={"log": {"reducer": "append", "default": []}}).node(
        "a", lambda s: None).edge(START, "a")
    assert plain.definition_hash() == same.definition_hash()
    assert declared.definition() != plain.definition()
    assert declared.definition()["state"]["log"] == {"reducer": "append", "default": []}


def test_a_run_stored_before_defaults_existed_resumes_as_it_started(tmp_path: Any) -> None:
    """A log whose run.started has no ``defaults`` (written by an earlier version) folds,
    and resumes, without them: the engine does not inject start values mid-run."""
    import asyncio

    from interlock import _log as L
    from interlock._store import RunRow, Summary, open_store

    def look(state: dict[str, Any]) -> dict[str, Any]:
        return {"saw": "history" in state}

    wf = Workflow("old-run", state={"history": "append"})
    wf.approval("gate").node("look", look)
    wf.edge(START, "gate").edge("gate", "look")
    url = f"sqlite:///{tmp_path}/runs.db"
    new = wf.run_sync(store=url, run_id="new")
    assert new.status == "WAITING_APPROVAL" and new.state["history"] == []

    async def copy_without_defaults() -> None:
        st = open_store(url)
        try:
            row = await st.get_run("new")
            writer = L.LogWriter()
            entries = []
            async for page in st.iter_entries("new", page=100):
                for e in page:
                    rec = e.record()
                    fields = {k: v for k, v in rec.items()
                              if k not in ("seq", "type", "at", "hash", "defaults")}
                    entries.append(writer.make(e.type, fields)[1])
            await st.create_run(RunRow(
                run_id="old", workflow=row.workflow, definition=row.definition,
                definition_hash=row.definition_hash, input=row.input, options={},
                created_at=row.created_at,
                summary=Summary(status="WAITING_APPROVAL", last_seq=writer.seq,
                                last_hash=writer.hash, steps=1, updated_at=row.created_at)),
                entries)
        finally:
            await st.close()

    asyncio.run(copy_without_defaults())
    old = asyncio.run(interlock.status("old", store=url))
    assert old.status == "WAITING_APPROVAL" and "history" not in old.state
    assert asyncio.run(interlock.verify("old", store=url)).ok
    assert wf.resume_sync("old", interlock.approve(), store=url).state["saw"] is False
    assert wf.resume_sync("new", interlock.approve(), store=url).state["saw"] is True
