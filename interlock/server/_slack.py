"""Slack: a Block Kit message per gate with Approve / Reject, posted and updated
with the official ``slack-sdk`` (`WebClient`'s ``chat.postMessage`` / ``chat.update``),
its interactivity requests verified by its `SignatureVerifier` (the signature, and a
timestamp at most 5 minutes away), refusals answered through the click's
``response_url`` as ephemeral messages.

The Web API is called from a thread (the SDK's client is synchronous; its asynchronous one
needs aiohttp). ``SLACK_API_URL`` replaces the Web API's base URL (tests use a local one).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from interlock import UsageError
from interlock.support import gate_text, install_hint

from ._deliveries import retry_after
from ._notify import decided_text, mrkdwn, payload

ACTION_IDS = {"approve": "interlock.approve", "reject": "interlock.reject"}
# an unknown outcome's buttons say what each does (approving runs the action again)
UNKNOWN_LABELS = {"approve": "Approve: run it AGAIN", "reject": "Reject: not done"}
TIMEOUT = 10  # seconds for one call of the Web API or a response_url


@dataclass(frozen=True, slots=True)
class Click:
    """A verified click: who (a Slack user id), on what, and where to answer."""

    user: str
    run_id: str
    gate: str
    decision: str  # approve | reject
    response_url: str | None
    request: int | None = None  # the seq of the asking it was posted for (None: an old button)


class Slack:
    """One workspace's bot (``SLACK_BOT_TOKEN``, ``SLACK_SIGNING_SECRET``) posting to one
    channel (``--slack-channel``)."""

    name = "slack"

    def __init__(self, channel: str, token: str, secret: str,
                 api_url: str | None = None) -> None:
        from slack_sdk import WebClient
        from slack_sdk.signature import SignatureVerifier

        self.channel = channel
        base = api_url or "https://slack.com/api/"
        # no retry inside the SDK: each attempt is the server's, and on record
        # (`_deliveries`: the backoff, Retry-After, the attempts counted in the log)
        self.client = WebClient(token=token, base_url=base.rstrip("/") + "/",
                                timeout=TIMEOUT, retry_handlers=[])
        self.verifier = SignatureVerifier(secret)

    @classmethod
    def from_env(cls, channel: str | None) -> Slack | None:
        if not channel:
            return None
        token, secret = os.environ.get("SLACK_BOT_TOKEN"), os.environ.get("SLACK_SIGNING_SECRET")
        missing = [n for n, v in (("SLACK_BOT_TOKEN", token),
                                  ("SLACK_SIGNING_SECRET", secret)) if not v]
        if missing:
            raise UsageError(f"--slack-channel {channel} needs {' and '.join(missing)} in the "
                             "environment (the bot's token, xoxb-..., and the app's signing "
                             "secret, from the Slack app's settings: docs/server.md)")
        try:
            import slack_sdk  # noqa: F401
        except ImportError:
            raise UsageError(f"--slack-channel needs slack-sdk: "
                             f"{install_hint('chat')}") from None
        assert token is not None and secret is not None
        return cls(channel, token, secret, os.environ.get("SLACK_API_URL"))

    # -- messages ------------------------------------------------------------------

    def message(self, workflow: str, run_id: str, gate: str, rec: dict[str, Any],
                public_url: str) -> dict[str, Any]:
        """The gate's message: what it shows, Approve / Reject, the dashboard link."""
        base = payload(workflow, run_id, rec, public_url)
        blocks = base["blocks"]
        link = blocks[-1]["elements"][0]["url"]
        decisions = rec.get("decisions") or []
        unknown = gate_text.is_unknown(rec)
        labels = UNKNOWN_LABELS if unknown else {"approve": "Approve", "reject": "Reject"}
        buttons: list[dict[str, Any]] = []
        # which asking of the gate the message is for (its approval.requested's seq): a
        # click decides only that one (`_chat.ChatApprovals.clicked`)
        asked = {"request": rec["seq"]} if rec.get("seq") is not None else {}
        for kind, style in (("approve", "primary"), ("reject", "danger")):
            if kind in decisions or not decisions or kind == "reject":
                buttons.append({
                    "type": "button", "action_id": ACTION_IDS[kind], "style": style,
                    "text": {"type": "plain_text", "text": labels[kind]},
                    "value": json.dumps({"run_id": run_id, "gate": gate, "decision": kind,
                                         **asked})})
        if unknown:  # Slack asks the clicker before the action is run again
            buttons[0]["style"] = "danger"
            buttons[0]["confirm"] = {
                "title": {"type": "plain_text", "text": "Run it again?"},
                "text": {"type": "plain_text", "text": _cut(
                    f"{gate_text.headline(rec)}. Check first that it did not happen; "
                    "to record the outcome you checked, approve in the inbox with data "
                    "instead.", 300)},
                "confirm": {"type": "plain_text", "text": "Run it again"},
                "deny": {"type": "plain_text", "text": "Cancel"}, "style": "danger"}
        buttons.append({"type": "button", "action_id": "interlock.open",
                        "text": {"type": "plain_text", "text": "Open in the dashboard"},
                        "url": link})
        blocks[-1] = {"type": "actions", "block_id": "interlock.decide", "elements": buttons}
        return {"text": base["text"], "blocks": blocks}

    @staticmethod
    def decided(message: dict[str, Any], decided: dict[str, Any], headline: str
                ) -> dict[str, Any]:
        """The message once the gate is decided: its first line says so (``headline``,
        `_notify.decided_headline`), the buttons are replaced by who and when."""
        blocks = [b for b in message["blocks"] if b.get("type") != "actions"]
        blocks[0] = {"type": "section", "text": {"type": "mrkdwn", "text": mrkdwn(headline)}}
        blocks.append({"type": "context", "elements": [
            {"type": "mrkdwn", "text": mrkdwn(decided_text(decided))}]})
        return {"text": mrkdwn(headline), "blocks": blocks}

    # -- the Web API -----------------------------------------------------------------

    async def post(self, message: dict[str, Any]) -> tuple[dict[str, object], dict[str, object]]:
        """``chat.postMessage``: (what to record, where the message is)."""
        return await self._call("chat.postMessage", self.client.chat_postMessage,
                                channel=self.channel, **message)

    async def update(self, where: dict[str, Any], message: dict[str, Any]
                     ) -> tuple[dict[str, object], dict[str, object]]:
        return await self._call("chat.update", self.client.chat_update,
                                channel=where["channel"], ts=where["ts"], **message)

    async def _call(self, method: str, call: Any, **kwargs: Any
                    ) -> tuple[dict[str, object], dict[str, object]]:
        from slack_sdk.errors import SlackApiError, SlackClientError

        try:
            response = await asyncio.to_thread(call, **kwargs)
        except SlackApiError as exc:
            outcome: dict[str, object] = {
                "method": method, "status": exc.response.status_code,
                "error": str(exc.response.get("error") or "not ok")}
            headers = {k.lower(): v for k, v in (exc.response.headers or {}).items()}
            wait = retry_after(_first(headers.get("retry-after")))
            if wait is not None:
                outcome["retry_after"] = wait
            return outcome, {}
        except (SlackClientError, OSError, ValueError) as exc:
            return {"method": method, "error": f"{type(exc).__name__}: {exc}"}, {}
        where = {"channel": response.get("channel") or kwargs.get("channel"),
                 "ts": response.get("ts")}
        return {"method": method, "status": response.status_code}, where

    async def answer(self, click: Click, text: str) -> dict[str, object]:
        """An ephemeral message to the clicking user, through the click's response_url."""
        from slack_sdk.webhook import WebhookClient

        if not click.response_url:
            return {"method": "response_url", "error": "the click had no response_url"}
        hook = WebhookClient(click.response_url, timeout=TIMEOUT)
        try:
            response = await asyncio.to_thread(hook.send, text=text,
                                               response_type="ephemeral",
                                               replace_original=False)
        except (OSError, ValueError) as exc:
            return {"method": "response_url", "error": f"{type(exc).__name__}: {exc}"}
        return {"method": "response_url", "status": response.status_code}

    # -- requests from Slack -----------------------------------------------------------

    def verify(self, body: bytes, headers: Mapping[str, str]) -> bool:
        timestamp = headers.get("x-slack-request-timestamp")
        signature = headers.get("x-slack-signature")
        if not timestamp or not timestamp.strip().isdigit():
            return False
        return bool(self.verifier.is_valid(body, timestamp, signature))

    @staticmethod
    def click(body: bytes) -> Click | None:
        """The click in a verified interactivity request (None: not a click of ours)."""
        form = parse_qs(body.decode("utf-8", "replace"))
        try:
            data = json.loads(form["payload"][0])
            action = next(a for a in data.get("actions") or []
                          if a.get("action_id") in ACTION_IDS.values())
            value = json.loads(action["value"])
            request = value.get("request")
            return Click(str(data["user"]["id"]), str(value["run_id"]), str(value["gate"]),
                         str(value["decision"]), data.get("response_url"),
                         None if request is None else int(request))
        except (KeyError, IndexError, StopIteration, TypeError, ValueError, AttributeError):
            return None


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _first(value: object) -> str | None:
    """A header's value (the SDK keeps some as lists)."""
    if isinstance(value, list | tuple):
        value = value[0] if value else None
    return None if value is None else str(value)
