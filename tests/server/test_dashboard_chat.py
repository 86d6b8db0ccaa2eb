"""Conversations in the dashboard (SPEC §11, §8) in a real browser: Chromium driven by
Playwright against a real ``interlock serve`` on loopback. A two-turn conversation typed
into the page, its reply shown growing token by token from a local OpenAI-compatible
server that streams (tests/fake_openai.py); a child run's gate approved in place on the
conversation page and the conversation going on. Skipped, saying why, where Playwright or
a Chromium is missing. Every wait is on a condition in the page."""

from __future__ import annotations

import json
import os
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _harness import write_auth
from _workflows import OPENAI_CHAT, RECORD_NODES, toolchat, triage
from fake_openai import FakeOpenAI
from test_dashboard import WAIT, browser, expect  # (the browser's skip too)
from test_server import TOKENS, Served

pytest.importorskip("fastapi")

__all__ = ["browser"]  # the fixture, used by name

CHAT = OPENAI_CHAT
TRIAGE = triage("chatdashnodes:record")
TOOLCHAT = toolchat("triage approved, db is swept", "glad to help")
NODES = RECORD_NODES


def _answer(body: dict[str, Any]) -> str:
    users = [m["content"] for m in body["messages"] if m["role"] == "user"]
    return f"Noted message number {len(users)} about {users[-1]}"


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeOpenAI]:
    f = FakeOpenAI(_answer)
    yield f
    f.close()


def _serve(root: Path, fake: FakeOpenAI, *args: str) -> Served:
    """``interlock serve`` over ``root``'s flows, its openai provider at ``fake``."""
    (root / "chatdashnodes.py").write_text(NODES)
    flows = root / "flows"
    flows.mkdir()
    for name, text in (("chat", CHAT), ("triage", TRIAGE), ("toolchat", TOOLCHAT)):
        (flows / f"{name}.yaml").write_text(textwrap.dedent(text))
    write_auth(root, TOKENS)
    saved = {k: os.environ.get(k) for k in ("INTERLOCK_STORE", "INTERLOCK_LOG_KEY",
                                            "OPENAI_API_KEY", "OPENAI_BASE_URL")}
    for name in ("INTERLOCK_STORE", "INTERLOCK_LOG_KEY"):
        os.environ.pop(name, None)
    os.environ["OPENAI_API_KEY"] = "sk-test"
    os.environ["OPENAI_BASE_URL"] = fake.url
    try:
        return Served(root, *args)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, fake: FakeOpenAI) -> Iterator[Served]:
    served = _serve(tmp_path_factory.mktemp("chatdash"), fake)
    yield served
    served.stop()


@pytest.fixture(scope="module")
def authed(tmp_path_factory: pytest.TempPathFactory, fake: FakeOpenAI) -> Iterator[Served]:
    served = _serve(tmp_path_factory.mktemp("chatdashauth"), fake, "--auth", "auth.yaml")
    yield served
    served.stop()


@pytest.fixture
def pages(browser: Any) -> Iterator[Callable[[str | None], Any]]:
    """A new page (its own browser context) holding ``token`` in its sessionStorage."""
    contexts: list[Any] = []
    errors: list[str] = []

    def new(token: str | None = None) -> Any:
        ctx = browser.new_context(viewport={"width": 1400, "height": 900})
        ctx.set_default_timeout(WAIT)
        ctx.on("weberror", lambda e: errors.append(str(e.error)))
        if token:
            ctx.add_init_script("if (location.protocol === 'http:') "
                                f"sessionStorage.setItem('interlock.token', {json.dumps(token)})")
        contexts.append(ctx)
        return ctx.new_page()

    yield new
    for ctx in contexts:
        ctx.close()
    assert not errors, f"uncaught errors in the page: {errors}"


@pytest.fixture
def page(pages: Callable[[str | None], Any]) -> Any:
    return pages(None)


def start(served: Served, workflow: str, run_id: str, token: str | None = None,
          data: dict[str, Any] | None = None) -> None:
    with served.client(token) as c:
        r = c.post(f"/api/workflows/{workflow}/runs", json={"input": data or {},
                                                           "run_id": run_id})
    assert r.status_code == 201, r.text


def send(page: Any, text: str) -> None:
    expect(page.locator("#message-send")).to_be_enabled()
    page.locator("#message-text").fill(text)
    page.locator("#message-send").click()


def test_conversations_are_listed_apart_from_workflow_runs(server: Served, page: Any) -> None:
    start(server, "chat", "listed-c")
    start(server, "toolchat", "listed-t")
    start(server, "triage", "listed-graph", data={"service": "db"})  # a workflow's run
    with server.client() as c:
        kinds = {w["name"]: w["kind"] for w in c.get("/api/workflows").json()}
    assert kinds == {"chat": "chat", "toolchat": "chat", "triage": "graph"}
    page.goto(server.url + "/conversations")
    expect(page.locator("h1")).to_have_text("Conversations")
    row = page.locator('tr[data-run="listed-c"]')
    expect(row).to_be_visible()
    expect(row.locator("[data-status]")).to_have_text("WAITING_INPUT")
    expect(page.locator('tr[data-run="listed-t"]')).to_be_visible()
    expect(page.locator('tr[data-run="listed-graph"]')).to_have_count(0)
    page.goto(server.url + "/")  # (the runs list still has every run)
    expect(page.locator('tr[data-run="listed-graph"]')).to_be_visible()
    page.goto(server.url + "/conversations")
    row.locator("a").first.click()
    expect(page).to_have_url(server.url + "/conversations/listed-c")
    expect(page.locator("#chat-status [data-status]")).to_have_text("WAITING_INPUT")


def test_two_turns_typed_with_the_reply_growing_as_tokens_arrive(
        server: Served, page: Any, fake: FakeOpenAI) -> None:
    start(server, "chat", "typed-c")
    page.goto(server.url + "/conversations/typed-c")
    expect(page.locator("#stream-state")).to_have_text("live")
    gate = threading.Event()
    fake.stream_gate = gate  # the model's server sends one word, then waits for the gate
    try:
        send(page, "db-7 is down")
        user = page.locator('.msg.user[data-role="user"]')
        expect(user).to_have_count(1)
        expect(user.locator(".text")).to_have_text("db-7 is down")
        growing = page.locator(".msg.assistant.streaming .text")
        # the first word is on the page while the rest of the reply is still unsent
        expect(growing).to_have_text("Noted ")
        assert not gate.is_set()
        gate.set()
        reply = page.locator(".msg.assistant").last
        expect(reply.locator(".text")).to_have_text("Noted message number 1 about db-7 is down")
        expect(reply).not_to_have_class("msg assistant streaming")
        assert fake.gate_waited is True
    finally:
        fake.stream_gate = None
    expect(page.locator("#chat-status [data-status]")).to_have_text("WAITING_INPUT")
    send(page, "and the api?")
    expect(page.locator(".msg.assistant .text").last).to_have_text(
        "Noted message number 2 about and the api?")
    expect(page.locator(".msg.user .text")).to_have_text(["db-7 is down", "and the api?"])
    # the model was sent the first turn with the second
    last = [m["content"] for m in fake.requests[-1]["body"]["messages"]]
    assert last[1:] == ["db-7 is down", "Noted message number 1 about db-7 is down",
                        "and the api?"]


def test_a_child_gate_approved_in_place_and_the_conversation_goes_on(
        server: Served, page: Any) -> None:
    start(server, "toolchat", "gated-c")
    page.goto(server.url + "/conversations/gated-c")
    expect(page.locator("#stream-state")).to_have_text("live")
    send(page, "triage db")
    card = page.locator('#chat-gate article.gate[data-node="assistant/run_triage/approval"]')
    expect(card).to_be_visible()
    expect(page.locator("#chat-status [data-status]")).to_have_text("WAITING_APPROVAL")
    expect(page.locator("#message-send")).to_be_disabled()  # a gate waits, not a message
    child = page.locator(".msg.tool-calls .child a")  # (folded: in a closed <details>)
    expect(child).to_have_count(1)
    child_id = child.text_content()
    assert child_id and child.get_attribute("href") == f"/runs/{child_id}"
    card.locator('button[data-decision="approve"]').click()
    expect(page.locator(".msg.assistant .text").last).to_have_text("triage approved, db is swept")
    expect(page.locator("#chat-status [data-status]")).to_have_text("WAITING_INPUT")
    expect(page.locator("#chat-gate article")).to_have_count(0)
    tools = page.locator(".msg.tool-calls details")
    tools.locator("summary").first.click()
    expect(tools.locator('.tool[data-tool="run_triage"]')).to_contain_text("approved")
    with server.client() as c:
        got = c.get(f"/api/runs/{child_id}")
        assert got.status_code == 200, (child_id, got.status_code, got.text)
        assert got.json()["status"] == "COMPLETED"
    send(page, "thanks")
    expect(page.locator(".msg.assistant .text").last).to_have_text("glad to help")
    shot = os.environ.get("INTERLOCK_SCREENSHOTS")
    if shot:  # docs/dashboard-conversation.png: INTERLOCK_SCREENSHOTS=docs
        page.screenshot(path=str(Path(shot) / "dashboard-conversation.png"))


def test_roles_a_viewer_cannot_send_an_operator_cannot_decide_an_admin_approves_in_place(
        authed: Served, pages: Callable[[str | None], Any]) -> None:
    start(authed, "toolchat", "roles-c", token="tok-olga")
    viewer = pages("tok-vic")
    viewer.goto(authed.url + "/conversations/roles-c")
    expect(viewer.locator("#chat-status [data-status]")).to_have_text("WAITING_INPUT")
    expect(viewer.locator(".not-allowed")).to_contain_text("may not send messages")
    expect(viewer.locator("#message-form")).to_have_count(0)
    operator = pages("tok-olga")
    operator.goto(authed.url + "/conversations/roles-c")
    send(operator, "triage db")
    expect(operator.locator(".msg.user .who")).to_have_text("user · olga")
    card = operator.locator('#chat-gate article.gate[data-node="assistant/run_triage/approval"]')
    expect(card.locator(".not-allowed")).to_contain_text("may not decide")
    expect(card.locator("button.decide")).to_have_count(0)
    admin = pages("tok-ada")
    admin.goto(authed.url + "/conversations/roles-c")
    approve = admin.locator('#chat-gate button[data-decision="approve"]')
    approve.click()
    # the operator's page follows: the reply, and its message box open again
    expect(operator.locator(".msg.assistant .text").last).to_have_text(
        "triage approved, db is swept")
    expect(operator.locator("#message-send")).to_be_enabled()
    expect(operator.locator(".msg.gate-note").last).to_contain_text("approved by ada")
