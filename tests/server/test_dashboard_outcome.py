"""An ``unknown_outcome`` gate in ``/api/approvals`` and on the dashboard, in a real
browser: a ``confirm: true`` node approved, its process SIGKILLed while the action ran
(the node kills it: a real killed process), the run resumed to wait at its unknown
outcome. The approval row and the inbox's card say the process died while the action
ran, when it started (UTC), its arguments, that approving runs it AGAIN and rejecting
records it as not done; the card has a field for the outcome checked by hand (the gate
has no ``input:`` schema), and an approve with it records that outcome without running
the action again. Chromium driven by Playwright against a real ``interlock serve``
(test_dashboard's harness); skipped, saying why, where either is missing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _workflows import ONE, ONODES
from test_dashboard import browser, context, status_of
from test_server import Served, pythonpath

__all__ = ["browser", "context"]  # the fixtures, used by name

expect = pytest.importorskip("playwright.sync_api").expect


UTC = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC")


def interlock(root: Path, *args: str) -> int:
    done = subprocess.run([sys.executable, "-m", "interlock", *args, "--store",
                           f"sqlite:///{root / 'runs.db'}"], cwd=root, capture_output=True,
                          env={**os.environ, "PYTHONPATH": pythonpath(root)}, timeout=120)
    return done.returncode


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store with run ``u1`` waiting at its unknown outcome."""
    for name in ("INTERLOCK_STORE", "INTERLOCK_LOG_KEY"):
        os.environ.pop(name, None)
    root = tmp_path_factory.mktemp("outcome")
    (root / "onodes.py").write_text(ONODES)
    (root / "flows").mkdir()
    (root / "flows" / "one.yaml").write_text(textwrap.dedent(ONE))
    assert interlock(root, "run", "flows/one.yaml", "--run-id", "u1", "--input",
                     '{"disk": "sda"}') == 3
    (root / "kill.me").touch()
    assert interlock(root, "resume", "u1", "--approve", "--by", "al") == -9
    assert interlock(root, "resume", "u1") == 3  # waits at its unknown outcome
    return root


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[Served]:
    served = Served(root)
    yield served
    served.stop()


def test_the_approval_row_explains_an_unknown_outcome(server: Served) -> None:
    with server.client() as c:
        rows = [r for r in c.get("/api/approvals").json() if r["run_id"] == "u1"]
    assert [r["kind"] for r in rows] == ["unknown_outcome"]
    outcome = rows[0]["outcome"]
    assert outcome["action"] == "node 'fix'"
    assert outcome["arguments"] == {"disk": "sda"}
    assert UTC.fullmatch(outcome["started_at"])
    text = "\n".join(outcome["explain"])
    assert "the process running it died" in text
    assert "approve: runs it AGAIN" in text and "records it as not done" in text
    assert outcome["data_example"] == {"result": {"FIELD": "VALUE"}}


def test_the_inbox_card_records_the_outcome_checked_by_hand(
        server: Served, root: Path, context: Any) -> None:
    page = context.new_page()
    page.goto(server.url + "/approvals?run_id=u1")
    card = page.locator('article.gate[data-run="u1"][data-node="fix"]')
    note = card.locator(".outcome-unknown")
    expect(note).to_contain_text("Outcome unknown: node 'fix', started")
    expect(note).to_contain_text("runs it AGAIN")
    expect(note).to_contain_text("records it as not done")
    expect(card.locator("dl.show")).to_contain_text("UTC")  # not an epoch float
    approve = card.locator('button[data-decision="approve"]')
    expect(approve).to_have_text("approve: run it AGAIN")
    expect(card.locator('button[data-decision="reject"]')).to_have_text(
        "reject: it was not done")
    field = card.get_by_label("outcome checked by hand")
    field.fill('{"wrong": 1}')  # checked before it is sent
    approve.click()
    expect(card.locator(".problem.local")).to_contain_text('{"result": ...}')
    field.fill('{"result": {"fixed": "by hand"}}')
    expect(approve).to_have_text("approve: record this outcome")
    approve.click()
    expect(card.locator(".result")).to_contain_text("approve recorded")
    assert status_of(server, "u1") == "COMPLETED"
    with server.client() as c:
        assert c.get("/api/runs/u1").json()["state"]["fixed"] == "by hand"
    assert (root / "fix.log").read_text() == "fix\n"  # recorded, not run again
