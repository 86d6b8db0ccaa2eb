"""The dashboard's operator actions (issue 33) in a real browser: a run started from the
form generated from the workflow's ``input:``, a cancel, a FAILED run resumed, a fork from
a record, and a role-aware page (a viewer sees no start form, cancel, resume or fork; an
operator does). Chromium driven by Playwright against a real ``interlock serve``
(test_dashboard's harness); skipped, saying why, where either is missing."""

from __future__ import annotations

import os
import re
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _harness import write_auth
from test_dashboard import EDITABLE, WAIT, browser, context, node_state, start, status_of
from test_server import NODES, SLOW, TOKENS, Served

__all__ = ["browser", "context"]  # the fixtures, used by name

expect = pytest.importorskip("playwright.sync_api").expect

OPSNODES = '''
from pathlib import Path

def flaky(state):
    if not Path("flaky.ok").exists():
        raise RuntimeError("the ledger is not reachable (create flaky.ok to fix it)")
    return {"done": state["n"] + 1}

def double(state):
    return {"twice": state["done"] * 2}

def lookup_control(control_id: str, year: int) -> dict:
    """Look up an internal control by id for a fiscal year."""
    return {"control": control_id, "tested": year >= 2024}
'''

AGENT = '''
workflow: agentic
input: [plan]
nodes:
  risk:
    reads: [plan]
    agent:
      provider: scripted
      model: acme-small
      system: You are an auditor.
      prompt: "Plan: {{ plan }}"
      output:
        type: object
        properties: {level: {enum: [LOW, HIGH]}, reason: {type: string}}
        required: [level, reason]
      tools: [opsnodes:lookup_control]
      replies:
        - tool_calls: [{name: lookup_control, arguments: {control_id: C-9, year: 2023}}]
          usage: {prompt_tokens: 1000, completion_tokens: 200}
        - content: {level: HIGH, reason: C-9 untested}
          usage: {prompt_tokens: 3000, completion_tokens: 100}
edges:
  - {from: START, to: risk}
  - {from: risk, to: END}
'''

YEARLY = '''
workflow: yearly
input: [n]
triggers:
  - {schedule: "0 0 1 1 *", input: {n: 1}}
nodes:
  first: snodes:first
edges:
  - {from: START, to: first}
  - {from: first, to: END}
'''

# USD per million tokens: (1000+3000)*2 + (200+100)*10 = 11,000 micro-dollars = $0.011
PRICES = "acme-small: {input: 2.0, output: 10.0}\n"

FLAKY = '''
workflow: flaky
input: [n]
state:
  done: {default: 0}
  twice: {default: 0}
nodes:
  flaky: opsnodes:flaky
  double: opsnodes:double
edges:
  - {from: START, to: flaky}
  - {from: flaky, to: double}
  - {from: double, to: END}
'''


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dashops")
    (root / "snodes.py").write_text(NODES)
    (root / "opsnodes.py").write_text(OPSNODES)
    flows = root / "flows"
    flows.mkdir()
    (flows / "editable.yaml").write_text(textwrap.dedent(EDITABLE))
    (flows / "flaky.yaml").write_text(textwrap.dedent(FLAKY))
    (flows / "agentic.yaml").write_text(textwrap.dedent(AGENT))
    (flows / "slow.yaml").write_text(textwrap.dedent(SLOW))
    (flows / "yearly.yaml").write_text(textwrap.dedent(YEARLY))
    (root / "prices.yaml").write_text(PRICES)
    write_auth(root, TOKENS)
    return root


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[Served]:
    for name in ("INTERLOCK_STORE", "INTERLOCK_LOG_KEY"):
        os.environ.pop(name, None)
    os.environ["INTERLOCK_PRICES"] = str(root / "prices.yaml")
    try:
        served = Served(root)
    finally:
        del os.environ["INTERLOCK_PRICES"]
    yield served
    served.stop()


@pytest.fixture(scope="module")
def authed(root: Path) -> Iterator[Served]:
    served = Served(root, "--auth", "auth.yaml", store=f"sqlite:///{root / 'auth-runs.db'}")
    yield served
    served.stop()


def status(page: Any) -> Any:
    return page.locator("#run-status [data-status]")


def test_a_run_started_from_the_form_is_followed_live(server: Served, context: Any) -> None:
    page = context.new_page()
    page.goto(server.url + "/workflows/editable")
    form = page.locator("#start-form")
    form.locator('input[data-field="n"]').fill("4")
    form.locator("#start-run-id").fill("form-1")
    form.locator("#start-run").click()
    expect(page).to_have_url(server.url + "/runs/form-1")
    expect(status(page)).to_have_attribute("data-status", "WAITING_APPROVAL")
    expect(node_state(page, "first")).to_have_attribute("data-state", "completed")
    page.evaluate("window.__same_page = true")
    with server.client() as c:  # the input typed in the form, parsed as JSON
        assert c.get("/api/runs/form-1").json()["state"]["n"] == 4
        r = c.post("/api/runs/form-1/decisions", json={"decision": "approve",
                                                       "node": "gate"})
        assert r.status_code < 300, r.text
    expect(status(page)).to_have_attribute("data-status", "COMPLETED")
    expect(node_state(page, "last")).to_have_attribute("data-state", "completed")
    assert page.evaluate("window.__same_page") is True
    # a config that is not a JSON object is refused in the page, nothing sent
    page.goto(server.url + "/workflows/editable")
    page.locator("#start-config").fill("[1, 2]")
    page.locator("#start-run").click()
    expect(page.locator("#start-form .problem")).to_contain_text("must be a JSON object")


def test_cancel_from_the_run_page(server: Served, context: Any) -> None:
    start(server, "editable", {"n": 1}, "cancel-1")
    page = context.new_page()
    page.goto(server.url + "/runs/cancel-1")
    expect(status(page)).to_have_attribute("data-status", "WAITING_APPROVAL")
    expect(page.locator("#resume-run")).to_be_hidden()
    page.on("dialog", lambda d: d.accept())
    page.locator("#cancel-run").click()
    expect(status(page)).to_have_attribute("data-status", "CANCELLED")
    expect(page.locator("#cancel-run")).to_be_hidden()
    assert status_of(server, "cancel-1") == "CANCELLED"


def test_a_failed_run_is_resumed_from_its_page(server: Served, root: Path,
                                               context: Any) -> None:
    (root / "flaky.ok").unlink(missing_ok=True)
    start(server, "flaky", {"n": 1}, "flaky-1")
    page = context.new_page()
    page.goto(server.url + "/runs/flaky-1")
    expect(status(page)).to_have_attribute("data-status", "FAILED")
    expect(page.locator("#cancel-run")).to_be_hidden()
    # the error panel: the message first, then the exception and its traceback
    error = page.locator("#run-error .error-panel")
    expect(error.locator(".error-message")).to_contain_text("the ledger is not reachable")
    expect(error.locator(".traceback")).to_contain_text("opsnodes.py")
    expect(error.locator(".traceback")).to_contain_text("RuntimeError")
    (root / "flaky.ok").write_text("fixed")
    page.locator("#resume-run").click()
    expect(status(page)).to_have_attribute("data-status", "COMPLETED")
    expect(node_state(page, "double")).to_have_attribute("data-state", "completed")
    with server.client() as c:
        assert c.get("/api/runs/flaky-1").json()["state"]["twice"] == 4
    expect(page.locator("#run-error")).to_be_empty()


def test_the_run_page_shows_input_state_at_a_record_timings_and_times(
        server: Served, root: Path, context: Any) -> None:
    (root / "flaky.ok").write_text("fixed")
    start(server, "flaky", {"n": 20}, "panels-1")
    page = context.new_page()
    page.goto(server.url + "/runs/panels-1")
    expect(status(page)).to_have_attribute("data-status", "COMPLETED")
    expect(page.locator("#run-input")).to_contain_text('"n": 20')
    expect(page.locator("#run-state")).to_contain_text('"twice": 42')  # the final state
    # the time column: hours, minutes, seconds and milliseconds (not the ms alone)
    at = page.locator('#timeline tr[data-seq="1"] td').nth(1).inner_text()
    assert re.fullmatch(r"\d\d:\d\d:\d\d[.,]\d{3}", at), at
    expect(page.locator("#run-times")).to_contain_text("took")
    for node in ("flaky", "double"):
        expect(page.locator(f'#node-timing tr[data-node="{node}"]')).to_contain_text("ms")
    # the state after the record where flaky completed: done set, twice not yet
    with server.client() as c:
        recs = c.get("/api/runs/panels-1/records").json()
        seq = next(r["seq"] for r in recs if r["type"] == "node.completed"
                   and r["node"] == "flaky")
        assert c.get("/api/runs/panels-1/state?at=10000").status_code == 422
    page.locator(f'#timeline tr[data-seq="{seq}"]:not([data-implied])').click()
    page.locator("#show-state").click()
    expect(page.locator("#state-title")).to_have_text(f"State after record {seq}")
    expect(page.locator("#run-state")).to_contain_text('"done": 21')
    expect(page.locator("#run-state")).to_contain_text('"twice": 0')
    page.locator("#show-final").click()
    expect(page.locator("#run-state")).to_contain_text('"twice": 42')


def test_a_fork_from_a_record(server: Served, root: Path, context: Any) -> None:
    (root / "flaky.ok").write_text("fixed")
    start(server, "flaky", {"n": 1}, "fork-src")
    with server.client() as c:
        recs = c.get("/api/runs/fork-src/records").json()
    after_flaky = next(r["seq"] for r in recs if r["type"] == "node.completed"
                       and r["node"] == "flaky")
    page = context.new_page()
    page.goto(server.url + "/runs/fork-src")
    expect(status(page)).to_have_attribute("data-status", "COMPLETED")
    page.locator(f'#timeline tr[data-seq="{after_flaky}"]:not([data-implied])').click()
    expect(page.locator("#fork-at")).to_have_value(str(after_flaky))
    page.locator("#fork-patch").fill('{"done": 10}')
    page.locator("#fork-run").click()
    expect(page).not_to_have_url(server.url + "/runs/fork-src", timeout=WAIT)
    expect(status(page)).to_have_attribute("data-status", "COMPLETED")
    expect(page.locator('#timeline tr[data-type="run.forked"]')).to_have_count(1)
    new_id = page.url.rsplit("/", 1)[1]
    with server.client() as c:
        assert c.get(f"/api/runs/{new_id}").json()["state"]["twice"] == 20
        assert c.get("/api/runs/fork-src").json()["state"]["twice"] == 4  # untouched
        # a record the run does not have: refused with the range, nothing created
        r = c.post("/api/runs/fork-src/fork", json={"at": 10_000})
        assert r.status_code == 422 and "1.." in r.json()["detail"]
        r = c.post("/api/runs/fork-src/fork", json={"at": 1, "run_id": "fork-src"})
        assert r.status_code == 409


def test_a_viewer_sees_no_operator_actions_and_an_operator_does(authed: Served,
                                                                context: Any) -> None:
    start(authed, "editable", {"n": 2}, "roles-1", token=TOKENS["olga"][0])
    page = context.new_page()
    page.goto(authed.url + "/runs/roles-1")
    page.locator("#token-input").fill(TOKENS["vic"][0])
    page.get_by_role("button", name="Use token").click()
    expect(status(page)).to_have_attribute("data-status", "WAITING_APPROVAL")
    expect(page.locator("#run-gate .not-allowed")).to_be_visible()
    expect(page.locator("#run-actions button")).to_have_count(0)
    expect(page.locator("#run-gate button.decide")).to_have_count(0)
    page.goto(authed.url + "/workflows/editable")
    expect(page.locator("h1")).to_contain_text("editable")
    expect(page.locator("#start-form")).to_have_count(0)
    with authed.client(TOKENS["vic"][0]) as c:  # the API refuses it all the same
        r = c.post("/api/runs/roles-1/fork", json={"at": 1})
        assert r.status_code == 403 and "vic (roles: viewer)" in r.text
        r = c.post("/api/workflows/editable/runs", json={"input": {"n": 1}})
        assert r.status_code == 403

    page.locator("#forget-token").click()
    page.locator("#token-input").fill(TOKENS["olga"][0])
    page.get_by_role("button", name="Use token").click()
    expect(page.locator("#start-form")).to_be_visible()
    page.goto(authed.url + "/runs/roles-1")
    expect(page.locator("#cancel-run")).to_be_visible()
    expect(page.locator("#fork-run")).to_be_visible()
    expect(page.locator("#run-gate button.decide")).to_have_count(0)  # not an approver


def test_an_agent_nodes_messages_with_tokens_and_cost(server: Served, context: Any) -> None:
    start(server, "agentic", {"plan": "rotate keys"}, "agent-1")
    page = context.new_page()
    page.goto(server.url + "/runs/agent-1")
    expect(status(page)).to_have_attribute("data-status", "COMPLETED")
    page.locator('svg.graph [data-node="risk"]').click()
    view = page.locator("#inspector .messages")
    expect(view.locator(".agent-facts")).to_contain_text("provider scripted")
    expect(view.locator(".agent-facts")).to_contain_text("model acme-small")
    expect(view.locator(".agent-facts")).to_contain_text("4300 token(s)")
    expect(view.locator(".agent-facts")).to_contain_text("cost $0.0110")
    roles = view.locator("li.msg").evaluate_all("els => els.map(e => e.dataset.role)")
    assert roles == ["system", "user", "assistant", "tool", "assistant"], roles
    expect(view.locator('li[data-role="system"]')).to_contain_text("You are an auditor.")
    expect(view.locator('li[data-role="user"]')).to_contain_text("Plan: rotate keys")
    expect(view.locator('.tool-call[data-tool="lookup_control"]')).to_contain_text("C-9")
    expect(view.locator('li[data-role="tool"]')).to_contain_text('"tested":false')
    expect(view.locator('li[data-role="assistant"]').last).to_contain_text("C-9 untested")
    expect(view.locator('li[data-role="assistant"]').first).to_contain_text("$0.0040")
    with server.client() as c:
        assert c.get("/api/prices").json() == {"acme-small": {"input": 2.0, "output": 10.0}}


def test_a_bad_price_table_is_named(tmp_path: Path) -> None:
    from interlock.server._routes_meta import read_prices

    bad = tmp_path / "p.yaml"
    bad.write_text("acme: {input: -1}\n")
    with pytest.raises(ValueError, match=r"model 'acme': expected \{input: USD"):
        read_prices(str(bad))
    bad.write_text("- acme\n")
    with pytest.raises(ValueError, match="a mapping of model names"):
        read_prices(str(bad))


@pytest.fixture(scope="module")
def bulk(server: Served, root: Path) -> list[float]:
    """500 finished runs of workflow ``bulk`` (bl-000 oldest .. bl-499 newest), input
    ``{n, team}``; their creation times."""
    import asyncio
    import sys
    from concurrent.futures import ThreadPoolExecutor

    import interlock

    sys.path.insert(0, str(root))
    try:
        wf = interlock.load({"workflow": "bulk", "input": ["n", "team"],
                             "nodes": {"first": "snodes:first"},
                             "edges": [{"from": "START", "to": "first"},
                                       {"from": "first", "to": "END"}]})

        async def fill() -> None:
            st = interlock.open_store(f"sqlite:///{root / 'runs.db'}")
            try:
                for i in range(500):
                    await wf.run({"n": i, "team": "ab"[i % 2]}, store=st,
                                 run_id=f"bl-{i:03d}")
            finally:
                await st.close()

        with ThreadPoolExecutor(1) as pool:  # (Playwright's loop runs in this thread)
            pool.submit(asyncio.run, fill()).result()
    finally:
        sys.path.remove(str(root))
    with server.client() as c:
        rows = c.get("/api/runs?workflow=bulk&limit=1000").json()["runs"]
    assert len(rows) == 500
    return [r["created_at"] for r in reversed(rows)]


def test_search_and_paging_over_500_runs(server: Served, bulk: list[float],
                                         context: Any) -> None:
    page = context.new_page()
    page.goto(server.url + "/?workflow=bulk")
    rows = page.locator("#runs tr")
    expect(rows).to_have_count(100)
    expect(rows.first).to_have_attribute("data-run", "bl-499")
    expect(rows.first.locator(".duration")).to_contain_text("s")  # ms or s: ended runs
    for older in range(4):  # past the newest 100, to the oldest
        page.get_by_role("link", name="older →").click()
        expect(page.locator("#runs-footer")).to_contain_text(
            f"runs {100 * (older + 1) + 1}–{100 * (older + 2)}, newest first")
    expect(rows.last).to_have_attribute("data-run", "bl-000")
    expect(page.get_by_role("link", name="older →")).to_have_count(0)

    # by run id
    page.goto(server.url + "/?workflow=bulk")
    page.locator("#filter-q").fill("bl-04")
    page.locator("#search-runs").click()
    expect(rows).to_have_count(10)
    expect(rows.first).to_have_attribute("data-run", "bl-049")
    assert "q=bl-04" in page.url
    # by an input field (the value read as JSON: n=250 is the number)
    page.locator("#filter-q").fill("")
    page.locator("#filter-input").fill("n=250")
    page.locator("#search-runs").click()
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-run", "bl-250")
    # ... and paging through a search's matches: team b is the odd ones, 250 of them
    page.locator("#filter-input").fill("team=b")
    page.locator("#search-runs").click()
    expect(rows).to_have_count(100)
    expect(rows.first).to_have_attribute("data-run", "bl-499")
    page.get_by_role("link", name="older →").click()
    expect(rows.first).to_have_attribute("data-run", "bl-299")
    page.get_by_role("link", name="older →").click()
    expect(rows).to_have_count(50)
    expect(rows.last).to_have_attribute("data-run", "bl-001")
    # a time range in the future: nothing; the runs' own range (from the URL): all
    page.locator("#clear-search").click()
    expect(rows).to_have_count(100)
    page.locator("#filter-since").fill("2999-01-01T00:00:00")
    page.locator("#search-runs").click()
    expect(page.locator("#runs-footer")).to_contain_text("no runs match")
    with server.client() as c:  # the API's range is exact: runs 100..199
        got = c.get(f"/api/runs?workflow=bulk&since={bulk[100]}&until={bulk[199]}"
                    "&limit=1000").json()
        assert [r["run_id"] for r in got["runs"]] == [f"bl-{i:03d}" for i in range(199, 99, -1)]
        assert got["next"] is None
        bad = c.get("/api/runs?input=nofield")
        assert bad.status_code == 422 and "pattern" in bad.text


def test_the_schedules_view(server: Served, context: Any) -> None:
    page = context.new_page()
    page.goto(server.url + "/schedules")
    row = page.locator('#schedules tr[data-workflow="yearly"]')
    expect(row.locator(".next-fire")).to_contain_text("-01-01 00:00:00")
    expect(row.locator(".last-run")).to_contain_text("never fired")
    with server.client() as c:
        (trigger,) = [t for t in c.get("/api/schedules").json() if t["workflow"] == "yearly"]
        assert trigger["kind"] == "schedule" and trigger["what"] == "0 0 1 1 *"
    # a run under the trigger's prefix is its last run (as a fired slot's would be)
    start(server, "yearly", {"n": 1}, trigger["run_prefix"] + "manual")
    expect(row.locator(".last-run")).to_contain_text(trigger["run_prefix"] + "manual",
                                                     timeout=WAIT)


def test_the_workers_view(server: Served, root: Path, context: Any) -> None:
    (root / "slow.release").unlink(missing_ok=True)
    (root / "slow.started").unlink(missing_ok=True)
    start(server, "slow", {}, "held-1")
    page = context.new_page()
    page.goto(server.url + "/workers")
    run = page.locator('#workers tr[data-run="held-1"]')
    try:
        expect(run).to_contain_text("RUNNING")
        expect(run.locator(".lease-left")).to_contain_text("left")
        owner = run.locator("xpath=ancestor::section").get_attribute("data-owner")
        assert owner and owner.split(":")[1] == str(server.proc.pid)  # the server holds it
        with server.client() as c:
            got = c.get("/api/workers").json()
        held = [r for w in got["workers"] for r in w["runs"] if r["run_id"] == "held-1"]
        assert held and held[0]["lease_left"] > 0
    finally:
        (root / "slow.release").write_text("go")
    expect(run).to_have_count(0)  # released once the run ended
