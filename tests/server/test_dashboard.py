"""The dashboard (SPEC §8) in a real browser: Chromium driven by Playwright, against a real
``interlock serve`` on a loopback port (tests/server/test_server.py's `Served`).

Skipped, saying why, where Playwright or a Chromium is missing (CI installs Debian's:
.ci/run). Every wait is on a condition in the page (``expect``/``wait_for_function``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _harness import write_auth
from test_server import GATED, NODES, SLOW, TOKENS, Served, wait_status

pytest.importorskip("fastapi")
sync_api = pytest.importorskip("playwright.sync_api",
                               reason="the browser tests need Playwright (the dev extra)")
expect = sync_api.expect

CHROMIUM = os.environ.get("INTERLOCK_TEST_CHROMIUM") or shutil.which("chromium") \
    or shutil.which("chromium-browser")
if not CHROMIUM:
    pytest.skip("no Chromium found (apt-get install chromium, or set INTERLOCK_TEST_CHROMIUM "
                "to a Chromium binary): the dashboard's browser tests are skipped",
                allow_module_level=True)

REPO = Path(__file__).resolve().parents[2]
EVENTS = REPO / "examples" / "incident" / "events"
WAIT = 15_000  # ms: a page condition's upper bound (a loaded 2-core machine)
expect.set_options(timeout=WAIT)

# test_server's gated workflow, open to any decider, with a reducer field to patch wrongly
EDITABLE = GATED.replace("workflow: gated",
                         "workflow: editable\nstate:\n  events: {reducer: append}") \
    .replace(', approvers: [alice, "role:admin"]', "")

# a gate that asks for data with an approval (SPEC §7 approval input:)
ASKS = GATED.replace("workflow: gated", "workflow: asks").replace(
    ', approvers: [alice, "role:admin"], on_modify: [first]',
    ", input: {type: object, required: [ticket], additionalProperties: false, "
    "properties: {ticket: {type: string, minLength: 3}}}")


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dash")
    (root / "snodes.py").write_text(NODES)
    (root / "examples").symlink_to(REPO / "examples")  # the incident example's nodes
    flows = root / "flows"
    flows.mkdir()
    shutil.copy(REPO / "examples" / "incident" / "workflow.yaml", flows / "incident.yaml")
    (flows / "editable.yaml").write_text(textwrap.dedent(EDITABLE))
    (flows / "slow.yaml").write_text(textwrap.dedent(SLOW))
    (flows / "asks.yaml").write_text(textwrap.dedent(ASKS))
    write_auth(root, TOKENS)
    return root


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[Served]:
    for name in ("INTERLOCK_STORE", "INTERLOCK_LOG_KEY"):
        os.environ.pop(name, None)
    served = Served(root)
    yield served
    served.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def context(browser: Any) -> Iterator[Any]:
    ctx = browser.new_context()
    ctx.set_default_timeout(WAIT)
    errors: list[str] = []
    ctx.on("weberror", lambda e: errors.append(str(e.error)))
    yield ctx
    ctx.close()
    assert not errors, f"uncaught errors in the page: {errors}"


def start(served: Served, workflow: str, data: dict[str, Any], run_id: str,
          token: str | None = None) -> dict[str, Any]:
    with served.client(token) as c:
        r = c.post(f"/api/workflows/{workflow}/runs", json={"input": data, "run_id": run_id})
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return body


def incident(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((EVENTS / name).read_text())
    return data


def status_of(served: Served, run_id: str, token: str | None = None) -> str:
    with served.client(token) as c:
        return str(c.get(f"/api/runs/{run_id}").json()["status"])


def waiting(served: Served, run_id: str) -> None:
    """Until the run waits at a gate (read from its event stream: no polling)."""
    with served.client() as c, c.stream("GET", f"/api/runs/{run_id}/events") as events:
        for line in events.iter_lines():
            if line == "event: run.waiting":
                return
    raise AssertionError(f"run {run_id} ended without waiting")


def node_state(page: Any, node: str) -> Any:
    return page.locator(f'svg.graph [data-node="{node}"]')


def test_a_run_live_from_the_graph_to_the_inbox(server: Served, context: Any) -> None:
    """The runs list shows a run started through the API; its page shows the graph's
    node states from the stream; approving in the inbox (another tab) moves the run
    page live to the confirmation gate, then to COMPLETED -- with no reload."""
    runs = context.new_page()
    runs.goto(server.url + "/")
    expect(runs.locator("h1")).to_have_text("Runs")
    start(server, "incident-response", incident("checkout-500.json"), "live-1")
    row = runs.locator('tr[data-run="live-1"]')
    expect(row).to_be_visible()
    row.get_by_role("link", name="live-1").click()
    page = runs  # the same tab: the run page
    expect(page.locator("#run-status [data-status]")).to_have_attribute(
        "data-status", "WAITING_APPROVAL")
    expect(node_state(page, "approval")).to_have_attribute("data-state", "waiting")
    for done in ("intake", "retrieval", "rag", "rca", "recommend"):
        expect(node_state(page, done)).to_have_attribute("data-state", "completed")
    expect(node_state(page, "code_fix")).to_have_attribute("data-state", "pending")
    expect(page.locator('#timeline tr[data-type="run.waiting"]')).to_have_count(1)
    page.evaluate("window.__same_page = true")

    # the edge into the fan-out, and the condition's reads once it is decided
    inbox = context.new_page()
    inbox.goto(server.url + "/approvals?run_id=live-1")
    card = inbox.locator('article.gate[data-run="live-1"][data-node="approval"]')
    expect(card.locator("dl.show")).to_contain_text("missing-tax-rate")
    card.locator("textarea.comment").fill("looks right")
    card.locator('button[data-decision="approve"]').click()
    expect(card.locator(".result")).to_contain_text("approve recorded")

    # live, on the first tab: the gate completed, the edge decision, code_fix's confirmation
    expect(node_state(page, "approval")).to_have_attribute("data-state", "completed")
    expect(node_state(page, "code_fix")).to_have_attribute("data-state", "waiting")
    expect(page.locator('svg.graph [data-edge="5"]')).to_have_attribute("data-state", "taken")
    expect(page.locator('svg.graph [data-edge="6"]')).to_have_attribute("data-state", "skipped")
    page.locator('svg.graph [data-edge="5"] .edge-hit').first.dispatch_event("click")
    side = page.locator("#inspector")
    expect(side.locator("ol.decisions li")).to_contain_text("taken")
    expect(side.locator(".reads")).to_contain_text("rca.confidence")
    expect(side.locator(".reads")).to_contain_text("0.85")

    confirm = inbox.locator('article.gate[data-run="live-1"][data-node="code_fix"]')
    confirm.locator('button[data-decision="approve"]').click()
    expect(page.locator("#run-status [data-status]")).to_have_attribute("data-status",
                                                                       "COMPLETED")
    expect(node_state(page, "code_fix")).to_have_attribute("data-state", "completed")
    expect(node_state(page, "END")).to_have_attribute("data-state", "reached")
    expect(page.locator("#stream-state")).to_have_attribute("data-state", "closed")
    assert page.evaluate("window.__same_page") is True  # no reload happened
    assert status_of(server, "live-1") == "COMPLETED"

    # a node's visit: its input (what it read), update and duration
    page.locator('svg.graph [data-node="rca"]').click()
    visit = side.locator('section.visit[data-visit="1"]')
    expect(visit.locator(".visit-input")).to_contain_text("retrieved_logs")
    expect(visit.locator(".visit-update")).to_contain_text("missing-tax-rate")
    expect(visit).to_contain_text("ms")
    # the card the decision removed from the inbox is marked, not silently dropped
    expect(card).to_have_class("card gate gone")


def test_reject_from_the_inbox(server: Served, context: Any) -> None:
    start(server, "incident-response", incident("logo-404.json"), "rej-1")
    waiting(server, "rej-1")
    page = context.new_page()
    page.goto(server.url + "/runs/rej-1")
    card = page.locator('#run-gate article.gate[data-run="rej-1"]')  # the run page's own card
    card.locator("textarea.comment").fill("not this one")
    card.locator('button[data-decision="reject"]').click()
    expect(page.locator("#run-status [data-status]")).to_have_attribute("data-status",
                                                                       "REJECTED")
    expect(page.locator('#timeline tr[data-type="approval.decided"]')).to_contain_text(
        "rejected by local: not this one")
    expect(node_state(page, "approval")).to_have_attribute("data-state", "rejected")
    expect(node_state(page, "code_fix")).to_have_attribute("data-state", "pending")
    assert status_of(server, "rej-1") == "REJECTED"


def refused_in_the_page(server: Served, context: Any, workflow: str, run_id: str,
                        field: str, decision: str, cases: list[tuple[str, str]]) -> Any:
    """Start a run to its gate, open the inbox, and fill ``field`` with each text of
    ``cases`` and press ``decision``: each is refused in the page with what it says, and
    nothing is sent. Returns (the card, the field, the button, the decisions sent)."""
    start(server, workflow, {"n": 1}, run_id)
    waiting(server, run_id)
    page = context.new_page()
    sent: list[str] = []
    page.on("request", lambda r: sent.append(r.url) if "/decisions" in r.url else None)
    page.goto(server.url + f"/approvals?run_id={run_id}")
    card = page.locator(f'article.gate[data-run="{run_id}"]')
    box = card.locator(f"textarea.{field}")
    button = card.locator(f'button[data-decision="{decision}"]')
    problem = card.locator('.problem[data-status="local"]')
    for text, says in cases:
        box.fill(text)
        button.click()
        expect(problem).to_contain_text(says)
    assert sent == []  # none of them left the page
    assert status_of(server, run_id) == "WAITING_APPROVAL"
    return card, box, button, sent


def test_modify_is_checked_in_the_page_before_it_is_sent(server: Served,
                                                          context: Any) -> None:
    card, patch, modify, sent = refused_in_the_page(
        server, context, "editable", "mod-1", "patch", "modify",
        [('{"frist": 5}', "'frist' is not a field this accepts"),
         ('{"events": "x"}', "expected array or null"),
         ("{}", "at least 1 field"),
         ("{first: 5", "not valid JSON")])
    patch.fill('{"first": 41}')
    modify.click()
    expect(card.locator(".result")).to_contain_text("modify recorded")
    assert len(sent) == 1
    with server.client() as c:
        records = c.get("/api/runs/mod-1/records").json()
    patched = [r for r in records if r["type"] == "state.patched"]
    assert patched and patched[0]["patch"] == {"first": 41}


def test_an_approvals_data_is_checked_against_its_input_schema(server: Served,
                                                                context: Any) -> None:
    card, data, approve, _ = refused_in_the_page(
        server, context, "asks", "ask-1", "data", "approve",
        [("", "this gate asks for data"),
         ('{"ticket": "x"}', "at least 3 character"),
         ('{"tikcet": "INC-1"}', "'ticket' is required"),
         ('{"ticket": 7}', "expected string")])
    data.fill('{"ticket": "INC-42"}')
    approve.click()
    expect(card.locator(".result")).to_contain_text("approve recorded")
    with server.client() as c:
        run = wait_status(c, "ask-1", "COMPLETED")
    assert run["state"]["gate"]["data"] == {"ticket": "INC-42"}


def test_the_servers_refusal_is_shown(server: Served, context: Any) -> None:
    """A decision someone else made first: the server's 409 problem detail, in the card."""
    start(server, "editable", {"n": 2}, "race-1")
    waiting(server, "race-1")
    page = context.new_page()
    page.goto(server.url + "/approvals?run_id=race-1")
    card = page.locator('article.gate[data-run="race-1"]')
    expect(card).to_be_visible()
    with server.client() as c:  # keep the page's inbox as it was: the gate still shown
        shown = c.get("/api/approvals").text
    page.route("**/api/approvals", lambda route: route.fulfill(
        status=200, content_type="application/json", body=shown))
    with server.client() as c:
        r = c.post("/api/runs/race-1/decisions", json={"decision": "approve", "by": "bob"})
    assert r.status_code == 200, r.text
    card.locator('button[data-decision="reject"]').click()
    refusal = card.locator('.problem[data-status="409"]')
    expect(refusal).to_contain_text("409 Conflict")
    # the server's own detail:
    expect(refusal).to_contain_text("was decided already: approved by bob")
    assert status_of(server, "race-1") == "COMPLETED"


def test_a_cli_run_in_another_process_appears_without_a_reload(server: Served, root: Path,
                                                                context: Any) -> None:
    page = context.new_page()
    page.goto(server.url + "/?workflow=slow")
    expect(page.locator("#filter-workflow")).to_have_value("slow")
    page.evaluate("window.__same_page = true")
    release = root / "slow.release"  # what test_server's slow node waits for
    cli = subprocess.Popen(
        [sys.executable, "-m", "interlock", "run", "flows/slow.yaml", "--run-id", "cli-1",
         "--store", f"sqlite:///{root / 'runs.db'}"],
        cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        row = page.locator('tr[data-run="cli-1"]')
        expect(row.locator("[data-status]")).to_have_attribute("data-status", "RUNNING")
        release.write_text("go")
        expect(row.locator("[data-status]")).to_have_attribute("data-status", "COMPLETED")
        assert cli.wait(30) == 0
    finally:
        if cli.poll() is None:
            cli.kill()
        cli.wait()
        assert cli.stderr is not None
        cli.stderr.close()
    assert page.evaluate("window.__same_page") is True
    # the filters: only this workflow's runs; a status filter that excludes it
    assert page.locator('tr[data-run="live-1"]').count() == 0
    page.locator("#filter-status").select_option("FAILED")
    expect(page.locator('tr[data-run="cli-1"]')).to_have_count(0)
    expect(page.locator("#runs-footer")).to_have_text("no runs match")
    assert "status=FAILED" in page.url


def test_the_workflow_page_draws_its_graph(server: Served, context: Any) -> None:
    page = context.new_page()
    page.goto(server.url + "/workflows")
    page.get_by_role("link", name="incident-response").click()
    expect(page.locator("h1")).to_contain_text("incident-response")
    graph = page.locator("svg.graph")
    for node in ("START", "intake", "retrieval", "rag", "rca", "recommend", "approval",
                 "code_fix", "END"):
        expect(graph.locator(f'[data-node="{node}"]')).to_have_count(1)
    expect(graph.locator("[data-edge]")).to_have_count(7)
    expect(page.locator("table").last).to_contain_text("rca.confidence >= config")


def test_run_data_is_shown_as_text_never_markup(server: Served, context: Any) -> None:
    """Input is user data: markup in it must not become elements (XSS)."""
    evil = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'
    start(server, "editable", {"n": 3}, "xss-1")
    waiting(server, "xss-1")
    with server.client() as c:  # a comment is shown in the timeline as it was written
        r = c.post("/api/runs/xss-1/decisions", json={"decision": "reject", "comment": evil})
    assert r.status_code == 200, r.text
    page = context.new_page()
    page.goto(server.url + "/runs/xss-1")
    decided = page.locator('#timeline tr[data-type="approval.decided"]')
    expect(decided).to_contain_text("<img src=x")
    assert page.locator("main img, main script").count() == 0
    assert page.evaluate("window.__pwned") is None


def test_the_run_page_reconnects_to_a_restarted_server_with_no_gap_or_duplicate(
        root: Path, context: Any) -> None:
    with socket.socket() as s:  # a free port, for both servers
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = f"sqlite:///{root / 'restart.db'}"
    stream = "#stream-state"
    first = Served(root, "--port", str(port), store=store)
    try:
        start(first, "editable", {"n": 5}, "rs-1")
        waiting(first, "rs-1")
        page = context.new_page()
        page.goto(first.url + "/runs/rs-1")
        expect(node_state(page, "gate")).to_have_attribute("data-state", "waiting")
        expect(page.locator(stream)).to_have_attribute("data-state", "open")
    finally:
        first.stop()
    expect(page.locator(stream)).to_have_attribute("data-state", "reconnecting")
    second = Served(root, "--port", str(port), store=store)
    try:
        expect(page.locator(stream)).to_have_attribute("data-state", "open")
        with second.client() as c:
            assert c.post("/api/runs/rs-1/decisions",
                          json={"decision": "approve"}).status_code == 200
            wait_status(c, "rs-1", "COMPLETED")
            stored = c.get("/api/runs/rs-1/records").json()
        expect(page.locator("#run-status [data-status]")).to_have_attribute("data-status",
                                                                           "COMPLETED")
        expect(page.locator(stream)).to_have_attribute("data-state", "closed")
        # the stored records, no gap, no duplicate (Last-Event-ID)
        seqs = page.eval_on_selector_all("#timeline tr:not([data-implied])",
                                         "rows => rows.map(r => +r.dataset.seq)")
        assert seqs == list(range(1, len(stored) + 1))
        # and, right after each, the records log format 2 implies in its place (where
        # format 1 wrote records: `implies`, as `trace` shows them), marked data-implied
        rows = page.eval_on_selector_all(
            "#timeline tr", "rows => rows.map(r => [+r.dataset.seq, r.dataset.type, "
            "'implied' in r.dataset])")
        expected = [row for r in stored for row in
                    [[r["seq"], r["type"], False],
                     *([i["seq"], i["type"], True] for i in r.get("implies", ()))]]
        assert rows == expected
        assert any(implied for _, _, implied in rows)  # (the chain's edges are implied)
    finally:
        second.stop()


@pytest.fixture(scope="module")
def authed(root: Path) -> Iterator[Served]:
    served = Served(root, "--auth", "auth.yaml", store=f"sqlite:///{root / 'auth-runs.db'}")
    yield served
    served.stop()


def test_with_auth_the_page_asks_for_a_token_and_a_viewer_cannot_approve(
        authed: Served, context: Any) -> None:
    start(authed, "incident-response", incident("checkout-500.json"), "auth-1",
          token=TOKENS["olga"][0])
    urls: list[str] = []
    page = context.new_page()
    page.on("request", lambda r: urls.append(r.url))
    # The refused token's "who am I" request is held until a valid token has been entered,
    # then answered: its late 401 must not clear the new token (it did, under load, before
    # a 401 named the token it was sent with and only cleared that one).
    held: list[Any] = []

    def hold_late(route: Any) -> None:
        if route.request.headers.get("authorization") == "Bearer not-a-token":
            held.append(route)
            return
        route.continue_()

    page.route("**/api/me", hold_late)
    page.goto(authed.url + "/")
    expect(page.locator("#token-form")).to_contain_text("needs a token")
    page.locator("#token-input").fill("not-a-token")
    page.get_by_role("button", name="Use token").click()
    expect(page.locator("#token-form")).to_contain_text("was refused")  # (the runs page's)
    assert len(held) == 1

    page.locator("#token-input").fill(TOKENS["vic"][0])
    page.get_by_role("button", name="Use token").click()
    expect(page.locator('tr[data-run="auth-1"]')).to_be_visible()
    expect(page.locator("#who")).to_have_text("vic (viewer)")
    page.evaluate("() => { window.late401 = 0; "
                  "addEventListener('interlock:unauthorized', () => { window.late401 += 1; }); }")
    with page.expect_response(lambda r: r.request.headers.get("authorization")
                              == "Bearer not-a-token"):
        held[0].continue_()
    page.wait_for_function("() => window.late401 >= 1")  # the page has read the late 401
    page.unroute("**/api/me")
    expect(page.locator("#token-form")).to_have_count(0)
    assert page.evaluate("() => sessionStorage.getItem('interlock.token')") == TOKENS["vic"][0]
    expect(page.locator("#who")).to_have_text("vic (viewer)")
    expect(page.locator('tr[data-run="auth-1"]')).to_be_visible()
    page.locator('a[data-nav="approvals"]').click()
    card = page.locator('article.gate[data-run="auth-1"][data-node="approval"]')
    # a viewer is shown the gate, not buttons that would be refused (issue 33)
    expect(card.locator(".not-allowed")).to_contain_text("vic (viewer) may not decide")
    expect(card.locator("button.decide")).to_have_count(0)
    expect(card.locator("textarea")).to_have_count(0)
    with authed.client(TOKENS["vic"][0]) as c:  # and the API refuses it all the same
        r = c.post("/api/runs/auth-1/decisions", json={"decision": "approve",
                                                       "node": "approval"})
    assert r.status_code == 403 and "vic (roles: viewer) may not decide approvals" in r.text
    assert status_of(authed, "auth-1", TOKENS["vic"][0]) == "WAITING_APPROVAL"
    page.goto(authed.url + "/runs/auth-1")
    expect(page.locator("#run-gate .not-allowed")).to_be_visible()
    expect(page.locator("#run-gate button.decide")).to_have_count(0)

    # the run page streams with the token in a header (fetch), never in a URL
    page.goto(authed.url + "/runs/auth-1")
    expect(node_state(page, "approval")).to_have_attribute("data-state", "waiting")
    expect(page.locator("#stream-state")).to_have_attribute("data-state", "open")
    assert not [u for u in urls if "tok-" in u]
    assert not [line for line in authed.lines if "tok-" in line]

    # an approver's token, from the same tab: the decision goes through
    page.locator("#forget-token").click()
    expect(page.locator("#token-form")).to_be_visible()
    page.locator("#token-input").fill(TOKENS["alice"][0])
    page.get_by_role("button", name="Use token").click()
    card = page.locator('#run-gate article.gate[data-node="approval"]')
    card.locator('button[data-decision="approve"]').click()
    expect(node_state(page, "code_fix")).to_have_attribute("data-state", "waiting")
    with authed.client(TOKENS["vic"][0]) as c:
        decided = [r for r in c.get("/api/runs/auth-1/records").json()
                   if r["type"] == "approval.decided"]
    assert decided[0]["by"] == "alice"


def test_the_runs_list_pages_older_and_back_to_the_newest(server: Served, root: Path,
                                                           context: Any) -> None:
    """The runs page follows the API's keyset cursor: older, then back to the newest."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    import interlock

    sys.path.insert(0, str(root))
    try:
        wf = interlock.load({"workflow": "paged", "nodes": {"first": "snodes:first"},
                             "edges": [{"from": "START", "to": "first"},
                                       {"from": "first", "to": "END"}]})

        async def fill() -> None:
            st = interlock.open_store(f"sqlite:///{root / 'runs.db'}")
            try:
                for i in range(103):
                    await wf.run({"n": i}, store=st, run_id=f"pg-{i:03d}")
            finally:
                await st.close()

        with ThreadPoolExecutor(1) as pool:  # (Playwright's loop runs in this thread)
            pool.submit(asyncio.run, fill()).result()
    finally:
        sys.path.remove(str(root))
    page = context.new_page()
    page.goto(server.url + "/?workflow=paged")
    rows = page.locator("#runs tr")
    expect(rows).to_have_count(100)
    expect(rows.first).to_have_attribute("data-run", "pg-102")
    expect(page.locator("#runs-footer")).to_contain_text("runs 1–100, newest first")
    page.get_by_role("link", name="older →").click()
    expect(rows).to_have_count(3)
    expect(rows.first).to_have_attribute("data-run", "pg-002")
    expect(page.locator("#runs-footer")).to_contain_text("runs 101–103, newest first")
    assert "cursor=" in page.url and "workflow=paged" in page.url
    expect(page.get_by_role("link", name="older →")).to_have_count(0)
    page.get_by_role("link", name="← newest").click()
    expect(rows).to_have_count(100)
    expect(rows.first).to_have_attribute("data-run", "pg-102")


def test_a_waiting_run_page_says_what_it_waits_for_not_running(server: Served,
                                                              context: Any) -> None:
    """A run at a gate is not running: its page says what it waits for, and since when
    (review 41: "running for 5.4 s" on a WAITING_APPROVAL run)."""
    start(server, "editable", {"n": 1}, "waits-1")
    waiting(server, "waits-1")
    page = context.new_page()
    page.goto(server.url + "/runs/waits-1")
    times = page.locator("#run-times")
    expect(times).to_contain_text(re.compile(r"waiting for a decision at gate for \d"))
    expect(times).not_to_contain_text("running for")
