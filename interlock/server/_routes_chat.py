"""The chats' endpoints (SPEC §13): Slack's interactivity requests, Google Chat's events.

They take no bearer token (the edge lets them through without one, and in the chat's own
body format): each request is verified here instead -- Slack's signature and timestamp,
Google's signed JWT -- and one that does not verify is answered 401 with nothing recorded.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from ._deps import Srv
from ._guard import Problemed

router = APIRouter()


@router.post("/api/integrations/slack/actions", include_in_schema=False)
async def slack_actions(request: Request, server: Srv) -> Response:
    slack, chat = server.slack, server.chat
    if slack is None or chat is None:
        raise Problemed(404, "Not Found", "this server posts no gates to Slack (serve "
                        "--slack-channel C... with SLACK_BOT_TOKEN and SLACK_SIGNING_SECRET)")
    body = await request.body()
    if not slack.verify(body, request.headers):
        raise Problemed(401, "Unauthorized", "the request's Slack signature does not verify, "
                        "or its timestamp is more than 5 minutes away (is "
                        "SLACK_SIGNING_SECRET the app's signing secret?)")
    click = slack.click(body)
    if click is not None:
        await chat.clicked(slack, click.user, click.run_id, click.gate, click.decision, click)
    return Response(status_code=200)
