"""Try interlock's Google Chat approvals without a Google project (needs the ``chat``
extra: PyJWT and cryptography).

``fake-api --dir DIR`` is a stand-in for the Chat API and Google's token endpoint on this
machine. It writes what the server needs into DIR: a service account key whose
``token_uri`` is the fake (``account.json``), and an RSA key of your own
(``click-key.pem``) with its public half as a JWKS (``chat-keys.json``, for
``--google-chat-keys``). It prints the ``serve`` settings to use, each card the server
posts, and for each of its buttons the ``click`` command that presses it.

``click`` sends what Google Chat sends when someone presses a button: a ``CARD_CLICKED``
event (the button's parameters in ``action.parameters`` and ``common.parameters``) to
``/api/integrations/google-chat/events``, with ``Authorization: Bearer JWT``, an RS256
token signed with ``click-key.pem``: issuer ``chat@system.gserviceaccount.com``, audience
the server's ``--google-chat-audience``, expiring in 5 minutes.

    python examples/chatops/google_chat_click.py fake-api --port 8843 --dir /tmp/gchat &
    # it prints the export line and the serve options; then, for a card's button:
    python examples/chatops/google_chat_click.py click --dir /tmp/gchat --user users/111 \\
        --params '{"run_id": "demo", "gate": "approval", "decision": "approve", "request": "9"}'
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import json
import shlex
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

EVENTS = "/api/integrations/google-chat/events"
ISSUER = "chat@system.gserviceaccount.com"
AUDIENCE = "try-audience"  # the server's --google-chat-audience (any string, both sides)


def make_keys(folder: Path, token_uri: str) -> None:
    """click-key.pem and chat-keys.json (made once), account.json (its token_uri: here)."""
    import jwt
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    def pem(key: Any) -> str:
        return str(key.private_bytes(serialization.Encoding.PEM,
                                     serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption()).decode())

    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "click-key.pem").exists():
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        (folder / "click-key.pem").write_text(pem(key))
        public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
        (folder / "chat-keys.json").write_text(json.dumps(
            {"keys": [{**public, "kid": "try", "alg": "RS256", "use": "sig"}]}))
    account = {"type": "service_account", "project_id": "try", "private_key_id": "try",
               "private_key": pem(rsa.generate_private_key(public_exponent=65537,
                                                           key_size=2048)),
               "client_email": "bot@try.iam.gserviceaccount.com", "client_id": "1",
               "token_uri": token_uri}
    (folder / "account.json").write_text(json.dumps(account))


def click(args: argparse.Namespace) -> int:
    import jwt

    params = json.loads(args.params)
    now = int(time.time())
    token = jwt.encode({"iss": ISSUER, "aud": args.audience, "iat": now, "exp": now + 300},
                       (Path(args.dir) / "click-key.pem").read_text(), algorithm="RS256",
                       headers={"kid": "try"})
    event = {"type": "CARD_CLICKED", "user": {"name": args.user, "type": "HUMAN"},
             "action": {"actionMethodName": "interlock.decide",
                        "parameters": [{"key": k, "value": v} for k, v in params.items()]},
             "common": {"invokedFunction": "interlock.decide", "parameters": params}}
    request = urllib.request.Request(
        args.server.rstrip("/") + EVENTS, data=json.dumps(event).encode(), method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            print(f"{answer.status} {answer.read().decode()}")
            return 0
    except urllib.error.HTTPError as exc:
        print(f"{exc.code} {exc.read().decode()}")
        return 1


def fake_api(args: argparse.Namespace) -> int:
    folder, count = Path(args.dir).resolve(), [0]

    class Handler(http.server.BaseHTTPRequestHandler):
        def _handle(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            path = self.path.split("?", 1)[0]
            answer: dict[str, Any]
            if path == "/token":
                answer = {"access_token": "ya29.fake", "expires_in": 3600,
                          "token_type": "Bearer"}
            else:
                data = json.loads(body or b"{}")
                count[0] += 1
                name = f"{path.removeprefix('/v1/')}/m{count[0]}" \
                    if self.command == "POST" else path.removeprefix("/v1/")
                show("posted" if self.command == "POST" else "updated", name, data)
                answer = {"name": name, **data}
            raw = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        do_POST = do_PATCH = _handle

        def log_message(self, *_: Any) -> None:
            pass

    def show(what: str, name: str, data: dict[str, Any]) -> None:
        print(f"{what} card {name}: {data.get('text')}")
        for card in data.get("cardsV2") or []:
            for widget in card["card"]["sections"][0]["widgets"]:
                said = (widget.get("textParagraph") or {}).get("text", "")
                if said.startswith("<i>"):  # a decided gate's: who decided, when
                    print("  " + said.removeprefix("<i>").removesuffix("</i>"))
                for button in (widget.get("buttonList") or {}).get("buttons") or []:
                    action = button["onClick"].get("action")
                    if action is not None:
                        params = {p["key"]: p["value"] for p in action["parameters"]}
                        print(f"  [{button['text']}] python {shlex.quote(sys.argv[0])} click "
                              f"--server {args.server} --dir {shlex.quote(str(folder))} "
                              f"--user USER --params {shlex.quote(json.dumps(params))}")
        sys.stdout.flush()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    make_keys(folder, base + "/token")
    print(f"fake Google Chat API on {base}", flush=True)
    print(f"export GOOGLE_CHAT_API_URL={base} "
          f"GOOGLE_CHAT_CREDENTIALS={shlex.quote(str(folder / 'account.json'))}")
    print(f"serve with: --google-chat-space spaces/TRY --google-chat-audience {AUDIENCE} "
          f"--google-chat-keys {shlex.quote(str(folder / 'chat-keys.json'))}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    fake = sub.add_parser("fake-api", help="a fake Chat API that prints what it gets")
    fake.add_argument("--port", type=int, default=8843, help="0: any free port")
    fake.add_argument("--dir", required=True, help="where the keys are written")
    fake.add_argument("--server", default="http://127.0.0.1:8765",
                      help="the interlock server, for the click commands it prints")
    press = sub.add_parser("click", help="press a button: a CARD_CLICKED event, signed")
    press.add_argument("--server", default="http://127.0.0.1:8765")
    press.add_argument("--dir", required=True, help="fake-api's --dir (its click-key.pem)")
    press.add_argument("--user", required=True, help="the clicker, users/… as Google names")
    press.add_argument("--params", required=True,
                       help="the button's parameters (a JSON object), as posted")
    press.add_argument("--audience", default=AUDIENCE,
                       help="the server's --google-chat-audience")
    args = parser.parse_args(argv)
    return click(args) if args.command == "click" else fake_api(args)


if __name__ == "__main__":
    sys.exit(main())
