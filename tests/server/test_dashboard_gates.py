"""Several gates at once on the dashboard, in a real browser: two approval gates in
parallel branches are two rows of the inbox and two cards of the run page, each deciding
its own gate (the API's ``node``), decided out of order -- the second on the run page,
the first in the inbox -- and the run going on to its join once. Chromium driven by
Playwright against a real ``interlock serve`` (test_dashboard's harness); skipped, saying
why, where either is missing."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_dashboard import browser, context, node_state, start, status_of
from test_server import Served

__all__ = ["browser", "context"]  # the fixtures, used by name

expect = pytest.importorskip("playwright.sync_api").expect

GNODES = '''
def start(state):
    return {"amount": 1200}

PATCH = ("--- a/app.py\\n+++ b/app.py\\n-    total = price * qty\\n"
         "+    total = price * (qty or 0)\\n")

def proposed(state):
    return {"action": {"title": "guard <b>qty</b>", "steps": ["apply", "test"],
                       "patch": PATCH},
            "note": "first line\\n<b>not bold</b>\\n  indented", "amount": 3}

def done(state):
    with open("done.log", "a") as f:
        f.write("done\\n")
    return {"done": True}
'''

AUDIT = """
    workflow: audit
    nodes:
      start: gnodes:start
      legal: {approval: {show: [amount]}}
      finance: {approval: {show: [amount]}}
      done: gnodes:done
    edges:
      - {from: START, to: start}
      - {from: start, to: [legal, finance]}
      - {from: [legal, finance], to: done}
"""

# a gate that shows a diff inside a structure, a multi-line string and a number
PROPOSED = """
    workflow: proposed
    nodes:
      propose: gnodes:proposed
      review: {approval: {show: [action, note, amount]}}
    edges:
      - {from: START, to: propose}
      - {from: propose, to: review}
"""

# a gate of a child run: decided through the parent, as its ``check/review``
KID = """
    workflow: kid
    input: [amount]
    nodes:
      review: {approval: {show: [amount]}}
    edges:
      - {from: START, to: review}
"""

FAMILY = """
    workflow: family
    nodes:
      start: gnodes:start
      check: {workflow: kid.yaml, input: {amount: amount}}
    edges:
      - {from: START, to: start}
      - {from: start, to: check}
"""


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gates")
    (root / "gnodes.py").write_text(GNODES)
    (root / "flows").mkdir()
    (root / "flows" / "audit.yaml").write_text(textwrap.dedent(AUDIT))
    (root / "flows" / "proposed.yaml").write_text(textwrap.dedent(PROPOSED))
    (root / "flows" / "kid.yaml").write_text(textwrap.dedent(KID))
    (root / "flows" / "family.yaml").write_text(textwrap.dedent(FAMILY))
    return root


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[Served]:
    for name in ("INTERLOCK_STORE", "INTERLOCK_LOG_KEY"):
        os.environ.pop(name, None)
    served = Served(root)
    yield served
    served.stop()


def decisions(server: Served, run_id: str) -> list[tuple[str, str, str]]:
    with server.client() as c:
        return [(r["node"], r["decision"], r.get("via")) for r in
                c.get(f"/api/runs/{run_id}/records").json() if r["type"] == "approval.decided"]


def test_two_parallel_gates_are_two_rows_decided_out_of_order_on_the_run_page_and_inbox(
        server: Served, root: Path, context: Any) -> None:
    start(server, "audit", {}, "par-1")
    inbox = context.new_page()
    inbox.goto(server.url + "/approvals?run_id=par-1")
    rows = inbox.locator('article.gate[data-run="par-1"]')
    expect(rows).to_have_count(2)
    expect(inbox.locator('article.gate[data-node="legal"] dl.show')).to_contain_text("1200")
    expect(inbox.locator('article.gate[data-node="finance"] dl.show')).to_contain_text("1200")

    page = context.new_page()
    page.goto(server.url + "/runs/par-1")
    cards = page.locator("#run-gate article.gate")
    expect(cards).to_have_count(2)  # one card per waiting gate, not the oldest only
    expect(node_state(page, "legal")).to_have_attribute("data-state", "waiting")
    expect(node_state(page, "finance")).to_have_attribute("data-state", "waiting")

    # the second gate first, on the run page: its own card decides its own node
    finance = page.locator('#run-gate article.gate[data-node="finance"]')
    finance.locator("textarea.comment").fill("budget ok")
    finance.locator('button[data-decision="approve"]').click()
    expect(node_state(page, "finance")).to_have_attribute("data-state", "completed")
    expect(page.locator('#run-gate article.gate[data-node="finance"]')).to_have_count(0)
    expect(page.locator('#run-gate article.gate[data-node="legal"]')).to_have_count(1)
    expect(node_state(page, "legal")).to_have_attribute("data-state", "waiting")
    assert status_of(server, "par-1") == "WAITING_APPROVAL"
    assert not (root / "done.log").exists()  # the join waits for legal

    # the inbox follows: finance's row marked, legal's still open; legal decided there
    expect(inbox.locator('article.gate[data-node="finance"]')).to_have_class("card gate gone")
    legal = inbox.locator('article.gate[data-node="legal"]')
    expect(legal).not_to_have_class("card gate gone")
    legal.locator('button[data-decision="approve"]').click()
    expect(legal.locator(".result")).to_contain_text("approve recorded")

    # the run page goes on, live, to the join and the end
    expect(page.locator("#run-status [data-status]")).to_have_attribute("data-status",
                                                                       "COMPLETED")
    expect(node_state(page, "done")).to_have_attribute("data-state", "completed")
    expect(page.locator("#run-gate article.gate")).to_have_count(0)
    assert decisions(server, "par-1") == [("finance", "approved", "dashboard"),
                                          ("legal", "approved", "dashboard")]
    assert (root / "done.log").read_text() == "done\n"  # the join fired once


def test_a_child_runs_gate_is_one_inbox_row_and_a_card_on_the_childs_page(
        server: Served, context: Any) -> None:
    """Review 42: the inbox listed a child run's gate twice (the parent's
    ``check/review`` and the child's own ``review``). Once now, the parent's row; the
    child's run page still has its card."""
    start(server, "family", {}, "fam-1")
    inbox = context.new_page()
    inbox.goto(server.url + "/approvals")
    expect(inbox.locator('article.gate[data-run="fam-1"][data-node="check/review"]')
           ).to_have_count(1)
    expect(inbox.locator('article.gate[data-run="fam-1.check.1"]')).to_have_count(0)
    page = context.new_page()
    page.goto(server.url + "/runs/fam-1.check.1")
    expect(page.locator('#run-gate article.gate[data-node="review"]')).to_have_count(1)


def test_a_gate_shows_text_of_several_lines_as_text(server: Served, context: Any) -> None:
    """Review 39: the incident's recommended_action.patch, a diff, was one JSON line with
    ``\\n``s on the approval card. A string of several lines is shown as its text,
    preformatted, and as text (``<b>`` stays literal); structures around it keep their
    fields, the rest stays JSON."""
    start(server, "proposed", {}, "prop-1")
    patch = ("--- a/app.py\n+++ b/app.py\n-    total = price * qty\n"
             "+    total = price * (qty or 0)\n")
    for where in ("/runs/prop-1", "/approvals?run_id=prop-1"):
        page = context.new_page()
        page.goto(server.url + where)
        show = page.locator('article.gate[data-node="review"] dl.show')
        expect(show).to_be_visible()
        action = show.locator("dd").first
        # (the state's fields in the log's order: sorted)
        expect(action.locator("dl.fields > dt")).to_have_text(["patch", "steps", "title"])
        diff = action.locator("pre.text")
        expect(diff).to_have_count(1)
        assert diff.evaluate("(e) => e.textContent") == patch
        expect(action.locator("dl.fields > dd > pre").last).to_have_text('"guard <b>qty</b>"')
        note = show.locator("pre.text").nth(1)
        assert note.evaluate("(e) => e.textContent") == "first line\n<b>not bold</b>\n  indented"
        expect(note.locator("b")).to_have_count(0)  # text, never HTML
        expect(show.locator("dd > pre:not(.text)").last).to_have_text("3")
        page.close()
