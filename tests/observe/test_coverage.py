"""`interlock coverage` (SPEC §10): what a workflow declares and its stored runs never did."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import interlock
from interlock import END, START, Workflow
from interlock.cli import cli

REPO = Path(__file__).resolve().parents[2]
INCIDENT = REPO / "examples" / "incident" / "workflow.yaml"


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.chdir(REPO)  # the examples' call targets resolve from the repository
    monkeypatch.syspath_prepend(str(REPO))
    return f"sqlite:///{tmp_path / 'runs.db'}"


def coverage_json(*args: str) -> tuple[int, Any]:
    result = CliRunner().invoke(cli, ["coverage", *args, "--json"], catch_exceptions=False)
    return result.exit_code, json.loads(result.stdout)


def edge(report: dict[str, Any], source: str, target: str) -> dict[str, Any]:
    [found] = [e for e in report["edges"] if e["from"] == source and e["to"] == target]
    return found


def test_the_incident_example_approved_twice_never_takes_its_otherwise_edge(
        db: str, tmp_path: Path) -> None:
    wf = interlock.load(INCIDENT)
    event = json.loads((REPO / "examples/incident/events/checkout-500.json").read_text())
    for k in range(2):
        first = wf.run_sync(event, store=db, config={"fix_dir": str(tmp_path / f"fix{k}")})
        assert first.status == "WAITING_APPROVAL"
        second = wf.resume_sync(first.run_id, interlock.approve(by="alice"), store=db)
        assert second.waiting is not None and second.waiting["node"] == "code_fix"
        done = wf.resume_sync(first.run_id, interlock.approve(by="alice"), store=db)
        assert done.status == "COMPLETED", done.error
    code, report = coverage_json(str(INCIDENT), "--store", db)
    assert code == 0
    assert report["runs"] == 2 and report["definitions"] == 1
    # the approval's policy edge was always true: its otherwise edge never ran
    assert edge(report, "approval", "code_fix")["taken"] == 2
    never = edge(report, "approval", "END")
    assert (never["taken"], never["skipped"]) == (0, 2)
    assert report["never_taken"] == ["approval -> END [otherwise]"]
    [policy] = [name for name in report["conditions"] if name.startswith("approval -> code_fix")]
    assert report["conditions"][policy] == {"true": 2, "false": 0}
    assert report["never_false"] == [policy] and report["never_true"] == []
    # the fan-out's two targets and the join are pairs of their own
    assert edge(report, "intake", "retrieval")["taken"] == 2
    assert edge(report, "[retrieval, rag]", "rca")["taken"] == 2
    assert report["gates"] == {"approval": {"approved": 2}}
    assert report["never_reached"] == []
    assert report["coverage"] == 87.5  # 7 of the 8 declared pairs
    # --fail-under: 87.5% passes 85 and fails 90
    assert coverage_json(str(INCIDENT), "--store", db, "--fail-under", "85")[0] == 0
    assert coverage_json(str(INCIDENT), "--store", db, "--fail-under", "90")[0] == 1


def routed() -> Workflow:
    async def classify(state: dict[str, Any]) -> dict[str, Any]:
        return {"level": state["level"]}

    async def step(state: dict[str, Any]) -> dict[str, Any]:
        return {}

    wf = Workflow("routed", input=["level"])
    for name in ("low", "high", "other", "audit"):
        wf.node(name, step)
    wf.node("classify", classify)
    wf.edge(START, "classify")
    wf.switch("classify", "level", {"LOW": "low", "HIGH": "high"}, default="other")
    wf.edge("low", "audit", when="level == 'LOW'").edge("low", END, otherwise=True)
    wf.edge("high", END).edge("other", END).edge("audit", END)
    return wf


def test_switch_cases_and_nodes_never_reached_are_reported(db: str) -> None:
    wf = routed()
    for level in ("LOW", "LOW", "MEDIUM"):
        assert wf.run_sync({"level": level}, store=db).status == "COMPLETED"
    report = asyncio_run(interlock.coverage(wf, store=db)).to_json()
    assert report["runs"] == 3
    assert edge(report, "classify", "low")["taken"] == 2
    assert edge(report, "classify", "other")["taken"] == 1  # the default
    high = edge(report, "classify", "high")
    assert (high["taken"], high["skipped"], high["case"]) == (0, 3, "HIGH")
    assert report["cases_never_matched"] == ["classify switch case HIGH -> high"]
    assert report["never_reached"] == ["high"]
    assert "high -> END" in report["never_taken"]
    [cond] = report["conditions"]
    assert report["conditions"][cond] == {"true": 2, "false": 0}


def test_coverage_by_name_and_for_every_workflow_and_a_name_it_does_not_know(db: str) -> None:
    wf = routed()
    wf.run_sync({"level": "HIGH"}, store=db)
    code, one = coverage_json("routed", "--store", db)
    assert code == 0 and one["workflow"] == "routed" and one["runs"] == 1
    code, every = coverage_json("--store", db)
    assert code == 0 and [r["workflow"] for r in every] == ["routed"]
    result = CliRunner().invoke(cli, ["coverage", "nope", "--store", db])
    assert result.exit_code == 2
    assert "no runs of a workflow named 'nope'" in result.output
    assert "workflows with runs: routed" in result.output


def test_the_table_marks_what_never_ran(db: str) -> None:
    wf = routed()
    wf.run_sync({"level": "LOW"}, store=db)
    result = CliRunner().invoke(cli, ["coverage", "routed", "--store", db])
    assert result.exit_code == 0, result.output
    assert "routed: 1 run, 4 of 9 edges taken (44.4%)" in result.output
    assert "nodes never reached: high, other" in result.output
    assert "conditions never false: low -> audit [level == 'LOW']" in result.output


def asyncio_run(coro: Any) -> Any:
    import asyncio

    return asyncio.run(coro)
