"""examples/code_assistant: LangGraph's code-assistant loop (generate -> check ->
regenerate on an error) with error edges, each branch run for real: the scripted model's
replies are swapped per branch, the check runs the code in its own process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

import interlock

REPO = Path(__file__).parent.parent
WORKFLOW = REPO / "examples" / "code_assistant" / "workflow.yaml"


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # examples.code_assistant.nodes resolves from here


def reply(code: str, imports: str = "import re") -> dict[str, Any]:
    return {"content": {"prefix": "p", "imports": imports, "code": code}}


GOOD = "result = sorted(['b', 'A'], key=str.lower)"


def run_with(replies: list[dict[str, Any]] | None, tmp_path: Path) -> tuple[Any, list[dict]]:
    data = YAML(typ="safe").load(WORKFLOW.read_text())
    if replies is not None:
        data["nodes"]["generate"]["agent"]["replies"] = replies
    wf = interlock.load(data)
    records: list[dict[str, Any]] = []
    result = wf.run_sync({"question": "sort these words"}, store=f"sqlite:///{tmp_path}/r.db",
                         listener=lambda rec, view: records.append(rec))
    return result, records


def started(records: list[dict[str, Any]]) -> list[str]:
    return [r["node"] for r in records if r["type"] == "node.started"]


def test_the_example_validates_and_fixes_its_code_on_the_second_try(tmp_path: Path) -> None:
    assert interlock.load(WORKFLOW).warnings == []
    result, records = run_with(None, tmp_path)
    assert result.status == "COMPLETED", result.error
    assert started(records) == ["generate", "check", "note_attempt", "generate", "check",
                                "answer"]
    assert result.state["checked"] == {"attempts": 2, "result": "['A', 'b', 'c']"}
    assert result.state["attempts"][0]["error"] == {
        "node": "check", "type": "NameError", "message": "name 'text' is not defined",
        "attempt": 1}
    # the second request to the model carries the first attempt's error
    requests = [r for r in records if r["type"] == "agent.request"]
    assert len(requests) == 2
    assert "Attempt 1 failed: NameError: name 'text' is not defined" in json.dumps(
        requests[1]).replace("\\n", "\n")
    assert "failed" not in json.dumps(requests[0])


def test_a_first_answer_that_works_goes_straight_to_the_answer(tmp_path: Path) -> None:
    result, records = run_with([reply(GOOD)], tmp_path)
    assert result.status == "COMPLETED"
    assert started(records) == ["generate", "check", "answer"]
    assert result.state["attempts"] == [] and "error" not in result.state


def test_the_loop_gives_up_once_its_retries_are_spent(tmp_path: Path) -> None:
    broken = reply("result = undefined_name")
    result, records = run_with([broken, broken, broken], tmp_path)
    assert result.status == "COMPLETED"
    assert started(records).count("generate") == 3  # the first try and 2 retries (max: 2)
    assert result.state["answer"] == ("no working code after 3 attempts; last error: "
                                      "NameError: name 'undefined_name' is not defined")


def test_an_error_the_loop_does_not_retry_gives_up_at_once(tmp_path: Path) -> None:
    result, records = run_with([reply("result = 1 / 0")], tmp_path)
    assert result.status == "COMPLETED"
    assert started(records) == ["generate", "check", "give_up"]
    assert result.state["error"]["type"] == "ZeroDivisionError"


def test_a_missing_import_is_caught_along_the_mro(tmp_path: Path) -> None:
    # ModuleNotFoundError is an ImportError: the edge lists ImportError
    result, records = run_with([reply(GOOD, imports="import no_such_module_here"),
                                reply(GOOD)], tmp_path)
    assert result.status == "COMPLETED"
    assert result.state["attempts"][0]["error"]["type"] == "ModuleNotFoundError"
    assert started(records)[-1] == "answer"
