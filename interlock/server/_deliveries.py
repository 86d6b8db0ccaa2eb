"""The chats' deliveries as an outbox kept in the run's own log.

A delivery is one message action for one gate in one chat: the gate's ``post``, or the
``update`` once it is decided. What is owed is worked out from the log, not from memory:
each gate asked (``approval.requested``) and decided (``approval.decided``) against the
``notify.sent`` records of the attempts made (`Ledger`). So a restarted server -- or
another one on the same store -- picks up where the last one stopped, and "was the
Slack message updated?" is answered by the log, months later: each attempt is a
``notify.sent`` record with its ``attempt`` number and the chat's answer (``status``,
``error``), and a failed one says what comes next -- ``retry_at`` (the time of the next
attempt, in seconds since the epoch), or ``gave_up`` (why there is none).

An attempt is retried when the chat may well take it later: no answer (a timeout, a
refused connection, no token), HTTP 429 or 5xx, or one of Slack's own transient errors;
after the chat's ``Retry-After`` when it sent one, else after an exponential backoff;
at most `Policy.attempts` attempts in all, counted across restarts. Any other refusal
(a 4xx, Slack's ``channel_not_found``) is final at once.

A gate's post is owed while the gate waits, an update once it is decided -- also after
the run has ended: ``notify.sent`` is the one record that may follow a run's final record.
A send whose answer came but whose record did not (the server killed between the two) is
sent again by the next server: an update says the same twice; a post would be a second
message (the window is the time one record takes to commit).
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

log = logging.getLogger("interlock.server")

# Slack answers some passing failures with HTTP 200 and ``ok: false``
SLACK_TRANSIENT = frozenset({"ratelimited", "internal_error", "fatal_error",
                             "service_unavailable", "request_timeout"})
LONGEST_WAIT = 900.0  # seconds: a Retry-After beyond this is cut to it

Outcome = dict[str, object]
Send = Callable[[], Awaitable[tuple[Outcome, Outcome]]]  # (what to record, where)
Record = Callable[[Outcome], Awaitable[None]]
StillOwed = Callable[[], Awaitable[bool]]


@dataclass(frozen=True, slots=True)
class Policy:
    """How often and how long a failed delivery is tried again."""

    attempts: int = 6  # in all, the first included
    backoff: float = 1.0  # seconds before the second attempt; doubled for each next one
    cap: float = 300.0  # the longest backoff between two attempts

    def wait(self, attempt: int, retry_after: object) -> float:
        """Seconds between attempt ``attempt`` (failed) and the next: the chat's
        ``Retry-After`` if it said one, else the backoff."""
        if isinstance(retry_after, int | float) and retry_after >= 0:
            return min(float(retry_after), LONGEST_WAIT)
        return min(self.backoff * 2.0 ** (attempt - 1), self.cap)


def retry_after(value: str | None) -> float | None:
    """An HTTP ``Retry-After`` in seconds (delay-seconds, or an HTTP date), or None."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def ok(rec: Mapping[str, object]) -> bool:
    """Whether an attempt's record says the chat took it (2xx and no error)."""
    status = rec.get("status")
    return rec.get("error") is None and (status is None or (
        isinstance(status, int) and 200 <= status < 300))


def retryable(outcome: Mapping[str, object]) -> bool:
    """Whether a failed attempt may succeed later (see the module's docstring)."""
    status = outcome.get("status")
    if status is None:
        return True  # no answer at all: a timeout, a refused connection, no token
    if status == 429 or (isinstance(status, int) and status >= 500):
        return True
    return outcome.get("error") in SLACK_TRANSIENT


@dataclass(slots=True)
class Ledger:
    """What the log says of one delivery: its attempts and the last one's record."""

    attempts: int = 0
    last: dict[str, object] | None = None

    def add(self, rec: dict[str, object]) -> None:
        number = rec.get("attempt")
        self.attempts = max(self.attempts + 1, number if isinstance(number, int) else 0)
        self.last = rec

    @property
    def delivered(self) -> bool:
        return self.last is not None and ok(self.last)

    @property
    def over(self) -> bool:
        """Delivered, or given up: nothing more is owed."""
        return self.last is not None and (ok(self.last) or self.last.get("retry_at") is None)

    @property
    def where(self) -> dict[str, object]:
        """Where the last attempt's message is (a post's: the message to update)."""
        where = self.last.get("where") if self.last is not None else None
        return dict(where) if isinstance(where, dict) else {}

    @property
    def not_before(self) -> float:
        at = self.last.get("retry_at") if self.last is not None else None
        return float(at) if isinstance(at, int | float) else 0.0


async def deliver(what: str, send: Send, record: Record, still_owed: StillOwed,
                  policy: Policy, done: Ledger) -> None:
    """Make the attempts left of one delivery (``done``: those in the log already),
    each recorded, until one is taken, one is refused for good, or none is left.
    ``still_owed`` is asked before each retry (a gate decided meanwhile needs no post)."""
    not_before = done.not_before
    for attempt in range(done.attempts + 1, policy.attempts + 1):
        if attempt > 1:
            await asyncio.sleep(max(0.0, not_before - time.time()))
            if not await still_owed():
                log.info("%s: no longer owed; no attempt %d", what, attempt)
                return
        outcome, where = await send()
        fields: Outcome = {**outcome, "attempt": attempt}
        if where:
            fields["where"] = where
        if not ok(outcome):
            if not retryable(outcome):
                fields["gave_up"] = "the chat refused it (not a passing failure)"
            elif attempt >= policy.attempts:
                fields["gave_up"] = f"{attempt} attempts failed"
            else:
                not_before = time.time() + policy.wait(attempt, outcome.get("retry_after"))
                fields["retry_at"] = round(not_before, 3)
        await record(fields)
        if "gave_up" in fields:
            log.warning("%s: attempt %d failed (%s); given up: %s", what, attempt,
                        outcome.get("error") or outcome.get("status"), fields["gave_up"])
        if "retry_at" not in fields:
            return
