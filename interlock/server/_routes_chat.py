"""The chats' endpoints: Slack's interactivity requests, Google Chat's events.

They take no bearer token (the edge lets them through without one, and in the chat's own
body format): each request is verified here instead -- Slack's signature and timestamp,
Google's signed JWT -- and one that does not verify is answered 401 with nothing recorded.
The caller is told only that it does not verify; why (and which setting to check) is
the operator's, in the server's log.
"""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request, Response

from ._deps import Srv
from ._google_chat import NotVerified
from ._guard import Problemed

router = APIRouter()
log = logging.getLogger("interlock.server")


@router.post("/api/integrations/slack/actions", include_in_schema=False)
async def slack_actions(request: Request, server: Srv) -> Response:
    slack, chat = server.slack, server.chat
    if slack is None or chat is None:
        raise Problemed(404, "Not Found", "this server posts no gates to Slack (serve "
                        "--slack-channel C... with SLACK_BOT_TOKEN and SLACK_SIGNING_SECRET)")
    body = await request.body()
    if not slack.verify(body, request.headers):
        log.warning("a Slack request to %s refused (401, nothing recorded): its signature "
                    "does not verify, or its timestamp is more than 5 minutes away (is "
                    "SLACK_SIGNING_SECRET the app's signing secret? is this host's clock "
                    "right?)", request.url.path)
        raise Problemed(401, "Unauthorized", "the request's signature does not verify")
    click = slack.click(body)
    if click is not None:
        refusal = await chat.clicked(slack, click.user, click.run_id, click.gate,
                                     click.decision, click.request)
        if refusal is not None:
            chat.answered(slack, click.run_id, click.gate, click.user,
                          slack.answer(click, f"No decision recorded: {refusal}"))
    return Response(status_code=200)


@router.post("/api/integrations/google-chat/events", include_in_schema=False)
async def google_chat_events(request: Request, server: Srv) -> dict[str, object]:
    google, chat = server.google_chat, server.chat
    if google is None or chat is None:
        raise Problemed(404, "Not Found", "this server posts no gates to Google Chat (serve "
                        "--google-chat-space spaces/... with GOOGLE_CHAT_CREDENTIALS)")
    try:
        await google.verify(request.headers.get("authorization"))
    except NotVerified as exc:
        log.warning("a Google Chat event refused (401, nothing recorded): its bearer token "
                    "is not one Google Chat signed for this app (%s); --google-chat-audience "
                    "must be the app's project number or endpoint URL as configured in "
                    "Google's console", exc)
        raise Problemed(401, "Unauthorized", "the request's token does not verify",
                        {"WWW-Authenticate": "Bearer"}) from None
    event = google.event(await request.body())
    if event is None:
        return {}
    refusal = await chat.clicked(google, event.user, event.run_id, event.gate,
                                 event.decision, event.request)
    if refusal is None:
        return {}
    chat.answered(google, event.run_id, event.gate, event.user,
                  {"method": "response", "status": 200})
    return google.reply(event, f"No decision recorded: {refusal}")
