"""The conversation page in a real browser (Chromium driven by Playwright) when its
event stream reads the log late (`test_token_order.LateReads`): two turns, three model
calls streamed word by word -- a reply that calls a tool, the reply after it, the next
turn's reply -- while the page's stream does not read, then all at once. Each reply is
shown once, in its place: the message, the reply that calls the tool, the tool call
folded below it, the turn's reply, the next message, its reply. Every wait is on a
condition in the page."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_dashboard import CHROMIUM, WAIT, expect, sync_api  # (the browser's skip too)
from test_token_order import InProcess, LateReads, project, waiting_after  # noqa: F401


@pytest.fixture
def page(project: Path) -> Iterator[Any]:  # noqa: F811
    errors: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        ctx = browser.new_context(viewport={"width": 1400, "height": 900})
        ctx.set_default_timeout(WAIT)
        ctx.on("weberror", lambda e: errors.append(str(e.error)))
        yield ctx.new_page()
        ctx.close()
        browser.close()
    assert not errors, f"uncaught errors in the page: {errors}"


def test_a_page_whose_stream_reads_late_shows_each_reply_once_in_order(
        project: Path, page: Any, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    late = LateReads(monkeypatch)
    served = InProcess(project)
    try:
        with served.client() as c:
            assert c.post("/api/workflows/talk/runs", json={"run_id": "p1"}).status_code == 201
            start = waiting_after(c, "p1", 0)
            late.armed = start
            page.goto(served.url + "/conversations/p1")
            assert late.held.wait(30)  # the page's stream has sent record start, no more
            expect(page.locator("#message-send")).to_be_enabled(timeout=WAIT)
            page.locator("#message-text").fill("is db-7 up?")
            page.locator("#message-send").click()
            expect(page.locator("#message-text")).to_have_value("", timeout=WAIT)  # (sent)
            start = waiting_after(c, "p1", start)
            assert c.post("/api/runs/p1/messages", json={"text": "and the api?"}
                          ).status_code == 202
            waiting_after(c, "p1", start)
            # nothing of the two turns is on the page yet
            expect(page.locator("#transcript > li")).to_have_count(0, timeout=WAIT)
            late.release.set()
            replies = ["let me look at db-7 first", "db-7 is down since noon, restarting it",
                       "the api answers in 40 ms"]
            assistant = page.locator("#transcript > li.msg.assistant")
            expect(assistant.locator(".text")).to_have_text(replies, timeout=WAIT)
            expect(page.locator("#transcript > li.streaming")).to_have_count(0, timeout=WAIT)
            expect(page.locator("#chat-status [data-status]")).to_have_text(
                "WAITING_INPUT", timeout=WAIT)
            roles = page.locator("#transcript > li").evaluate_all(
                "els => els.map((e) => e.dataset.role)")
            assert roles == ["user", "assistant", "tools", "assistant", "user", "assistant"]
            expect(page.locator("#transcript > li.msg.user .text")).to_have_text(
                ["is db-7 up?", "and the api?"], timeout=WAIT)
            tools = page.locator("#transcript > li.tool-calls")
            expect(tools.locator(".tool")).to_have_attribute("data-tool", "lookup")
            # the recorded view (a reload: records only, no pieces) is the same
            page.reload()
            expect(assistant.locator(".text")).to_have_text(replies, timeout=WAIT)
            assert page.locator("#transcript > li").evaluate_all(
                "els => els.map((e) => e.dataset.role)") == roles
    finally:
        late.release.set()
        served.stop()
