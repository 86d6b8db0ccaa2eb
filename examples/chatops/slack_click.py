"""Try interlock's Slack approvals without a Slack workspace (standard library only).

``fake-api`` is a stand-in for Slack's Web API on this machine: point ``SLACK_API_URL``
at it and ``interlock serve --slack-channel`` posts its gate messages there. It prints
each message, and for each of its buttons the ``click`` command that presses it. It also
prints the ephemeral answers the server sends back (to a click's ``response_url``).

``click`` sends what Slack sends when someone presses a button: a form-encoded POST of
one field, ``payload`` (a ``block_actions`` JSON object: the user, the button's
``action_id`` and ``value``, the ``response_url``), to
``/api/integrations/slack/actions``, signed with the app's signing secret:
``X-Slack-Signature: v0=HMAC-SHA256(secret, "v0:" + timestamp + ":" + body)`` and
``X-Slack-Request-Timestamp`` (the server refuses one more than 5 minutes away).

    python examples/chatops/slack_click.py fake-api --port 8842 &
    export SLACK_API_URL=http://127.0.0.1:8842/ SLACK_BOT_TOKEN=xoxb-fake \\
        SLACK_SIGNING_SECRET=try-secret
    interlock serve --workflows examples/incident/ --auth auth.yaml \\
        --slack-channel C0TRY &       # auth.yaml: an approver entry with slack: U0ALICE
    # start a run that reaches a gate; fake-api prints the message and, per button:
    python examples/chatops/slack_click.py click --user U0ALICE \\
        --value '{"run_id": "demo", "gate": "approval", "decision": "approve", "request": 9}'
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import hmac
import http.server
import json
import os
import shlex
import sys
import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlencode

ACTIONS = "/api/integrations/slack/actions"


def signed(secret: str, body: bytes, now: float | None = None) -> dict[str, str]:
    """The headers Slack signs a request with."""
    ts = str(int(time.time() if now is None else now))
    mac = hmac.new(secret.encode(), b"v0:" + ts.encode() + b":" + body, hashlib.sha256)
    return {"X-Slack-Request-Timestamp": ts, "X-Slack-Signature": "v0=" + mac.hexdigest(),
            "Content-Type": "application/x-www-form-urlencoded"}


def click_body(user: str, value: str, response_url: str) -> bytes:
    """The form Slack posts for a click on the button whose ``value`` is ``value``."""
    decision = json.loads(value)["decision"]
    payload = {"type": "block_actions", "user": {"id": user, "name": user.lower()},
               "response_url": response_url,
               "container": {"type": "message", "message_ts": "1700000000.000001"},
               "actions": [{"type": "button", "action_id": f"interlock.{decision}",
                            "block_id": "interlock.decide", "value": value,
                            "action_ts": f"{time.time():.6f}"}]}
    return urlencode({"payload": json.dumps(payload)}).encode()


def click(args: argparse.Namespace) -> int:
    body = click_body(args.user, args.value, args.response_url)
    request = urllib.request.Request(args.server.rstrip("/") + ACTIONS, data=body,
                                     headers=signed(args.secret, body), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            print(f"{answer.status} {answer.read().decode() or '(no body)'}")
            return 0
    except urllib.error.HTTPError as exc:
        print(f"{exc.code} {exc.read().decode()}")
        return 1


def fake_api(args: argparse.Namespace) -> int:
    posted, respond = [0], [""]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            data = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0))
                              or b"{}")
            answer: dict[str, Any] = {"ok": True}
            if self.path.endswith("/chat.postMessage"):
                posted[0] += 1
                answer |= {"channel": data.get("channel"), "ts": f"1700000000.{posted[0]:06d}"}
                show("posted", answer["ts"], data)
            elif self.path.endswith("/chat.update"):
                answer |= {"channel": data.get("channel"), "ts": data.get("ts")}
                show("updated", answer["ts"], data)
            elif self.path.startswith("/respond"):
                print(f"answered (ephemeral, to the clicker): {data.get('text')}", flush=True)
            raw = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *_: Any) -> None:
            pass

    def show(what: str, ts: str, data: dict[str, Any]) -> None:
        print(f"{what} message {ts} in {data.get('channel')}: {data.get('text')}")
        for block in data.get("blocks") or []:
            if block.get("type") == "context":  # a decided gate's: who decided, when
                print("  " + " ".join(e.get("text", "") for e in block.get("elements") or []))
            for button in block.get("elements") or []:
                if str(button.get("action_id", "")).startswith("interlock.") and \
                        "value" in button:
                    print(f"  [{button['text']['text']}] python {shlex.quote(sys.argv[0])} "
                          f"click --server {args.server} --response-url {respond[0]} "
                          f"--user USER --value {shlex.quote(button['value'])}")
        sys.stdout.flush()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    respond[0] = base + "respond"
    print(f"fake Slack Web API on {base} (SLACK_API_URL); a click's response_url: "
          f"{respond[0]}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    fake = sub.add_parser("fake-api", help="a fake Slack Web API that prints what it gets")
    fake.add_argument("--port", type=int, default=8842, help="0: any free port")
    fake.add_argument("--server", default="http://127.0.0.1:8765",
                      help="the interlock server, for the click commands it prints")
    press = sub.add_parser("click", help="press a button: a signed block_actions request")
    press.add_argument("--server", default="http://127.0.0.1:8765")
    press.add_argument("--user", required=True, help="the clicker's Slack user id (U…)")
    press.add_argument("--value", required=True, help="the button's value (JSON), as posted")
    press.add_argument("--secret", default=os.environ.get("SLACK_SIGNING_SECRET"),
                       help="the signing secret (default $SLACK_SIGNING_SECRET)")
    press.add_argument("--response-url", default="http://127.0.0.1:8842/respond",
                       help="where the server sends an ephemeral answer (fake-api's)")
    args = parser.parse_args(argv)
    if args.command == "click" and not args.secret:
        parser.error("click needs --secret or $SLACK_SIGNING_SECRET (the server's)")
    return click(args) if args.command == "click" else fake_api(args)


if __name__ == "__main__":
    sys.exit(main())
