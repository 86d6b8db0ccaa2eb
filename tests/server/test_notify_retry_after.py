"""``--notify URL``: a webhook that answers 429 or 503 with ``Retry-After`` is tried again
after that delay (seconds or an HTTP date, cut to the longest wait), not after the
default backoff; other failures keep the backoff. Each attempt's ``notify.sent`` says
the delay the webhook asked for. Against a local fake webhook on loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from _workflows import one_gate

import interlock

pytest.importorskip("httpx")

GATED = one_gate("hooked")


class _Hook(http.server.BaseHTTPRequestHandler):
    """Answers each POST with the next of ``answers`` (status, Retry-After or None)."""

    answers: ClassVar[list[tuple[int, str | None]]] = []
    posts: ClassVar[int] = 0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        type(self).posts += 1
        code, later = type(self).answers.pop(0) if type(self).answers else (200, None)
        self.send_response(code)
        if later is not None:
            self.send_header("Retry-After", later)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.asynccontextmanager
async def _no_lock(run_id: str) -> AsyncIterator[None]:
    yield


def test_retry_after_of_a_429_or_503_is_the_wait_before_the_next_attempt(
        tmp_path: Path) -> None:
    from interlock.server._deliveries import LONGEST_WAIT
    from interlock.server._hub import Hub
    from interlock.server._notify import Notifier

    _Hook.answers = [(429, "7"), (503, "Wed, 21 Oct 2099 07:28:00 GMT"), (500, "3"),
                     (503, None), (200, None)]
    _Hook.posts = 0
    hook = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    flow = tmp_path / "hooked.yaml"
    flow.write_text(GATED)

    async def main() -> list[dict[str, Any]]:
        store = interlock.open_store(f"sqlite:///{tmp_path / 'runs.db'}")
        try:
            result = await interlock.load(str(flow)).run({}, store=store, run_id="h1")
            assert result.status == "WAITING_APPROVAL"
            requested = next(r for r in await interlock.trace("h1", store=store)
                             if r["type"] == "approval.requested")
            waits: list[float] = []
            notifier = Notifier([f"http://127.0.0.1:{hook.server_address[1]}/hook"],
                                "http://inbox", store, Hub(), _no_lock, attempts=5,
                                backoff=0.5)

            async def pause(seconds: float) -> None:  # no real wait: the asked one, noted
                waits.append(seconds)

            notifier.pause = pause  # type: ignore[method-assign]
            try:
                await notifier._deliver(1, notifier.urls[0], "h1", requested["seq"],
                                        {"text": "x"})
            finally:
                await notifier.close()
            # the 429's 7 s; the 503's date, years away, cut to the longest wait; a 500's
            # Retry-After is not a promise (the backoff's third step: 0.5 * 2**2); a 503
            # without one: the backoff
            assert waits == [7.0, LONGEST_WAIT, 2.0, 4.0]
            return [r for r in await interlock.trace("h1", store=store)
                    if r["type"] == "notify.sent"]
        finally:
            await store.close()

    try:
        sent = asyncio.run(main())
    finally:
        hook.shutdown()
        hook.server_close()
    assert _Hook.posts == 5
    assert [(s["attempt"], s["status"]) for s in sent] == [
        (1, 429), (2, 503), (3, 500), (4, 503), (5, 200)]
    assert sent[0]["retry_after"] == 7.0
    assert sent[1]["retry_after"] > LONGEST_WAIT  # as asked (the wait is what is cut)
    assert all("retry_after" not in s for s in sent[2:])
