"""Gates in Google Chat (SPEC §13) against a real ``interlock serve``, a fake Chat API and
a fake token endpoint (one real HTTP server on loopback: ``GOOGLE_CHAT_API_URL`` and the
service account key's ``token_uri``), with clicks as CARD_CLICKED events carrying JWTs
signed by a test key (its public half in ``--google-chat-keys``)."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest
import test_slack
from _harness import write_auth
from test_server import Served, wait_status
from test_slack import decided, posted, start

httpx = pytest.importorskip("httpx")
jwt = pytest.importorskip("jwt")
rsa = pytest.importorskip("cryptography.hazmat.primitives.asymmetric.rsa")
serialization = pytest.importorskip("cryptography.hazmat.primitives.serialization")

AUDIENCE = "123456789012"  # the app's project number
ISSUER = "chat@system.gserviceaccount.com"
USERS = {  # name: (token, roles, Google Chat user)
    "alice": ("tok-alice", ["approver"], "users/111"),
    "bob": ("tok-bob", ["approver"], "users/222"),  # not in the gate's approvers:
    "olga": ("tok-olga", ["operator"], None),
}


project = test_slack.project  # (the scratch project: a node module, the gated workflow)


def _key() -> Any:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


GOOGLE_KEY, OTHER_KEY, ACCOUNT_KEY = _key(), _key(), _key()


class FakeGoogle:
    """The token endpoint and the Chat API's messages, on loopback; what each got."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any, dict[str, str]]] = []
        self.changed = threading.Condition()
        # answers given before the next success of a method (POST, PATCH): (method,
        # status, headers), the first that matches used once
        self.failures: list[tuple[str, int, dict[str, str]]] = []
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _handle(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                path = self.path.split("?", 1)[0]
                data: Any = parse_qs(body.decode()) if path == "/token" else \
                    json.loads(body or b"{}")
                with fake.changed:
                    failure = None if path == "/token" else next(
                        (f for f in fake.failures if f[0] == self.command), None)
                    if failure is not None:
                        fake.failures.remove(failure)
                    fake.calls.append((self.command, self.path, data, dict(self.headers)))
                    n = len(fake.calls)
                    fake.changed.notify_all()
                if failure is not None:
                    raw = json.dumps({"error": {"code": failure[1]}}).encode()
                    self.send_response(failure[1])
                    for name, value in failure[2].items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(raw)))
                    self.end_headers()
                    self.wfile.write(raw)
                    return
                if path == "/token":
                    answer: dict[str, Any] = {"access_token": "ya29.test-token",
                                              "expires_in": 3600, "token_type": "Bearer"}
                elif self.command == "POST":
                    answer = {"name": f"{path.removeprefix('/v1/')}/m{n}", **data}
                else:
                    answer = {"name": path.removeprefix("/v1/"), **data}
                raw = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            do_POST = do_PATCH = _handle

            def log_message(self, *args: Any) -> None:
                pass

        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def of(self, method: str, prefix: str = "/v1/") -> list[tuple[str, Any, dict[str, str]]]:
        return [(p, d, h) for m, p, d, h in self.calls if m == method and p.startswith(prefix)]

    def wait(self, method: str, count: int = 1) -> list[tuple[str, Any, dict[str, str]]]:
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.of(method)) >= count, 30), \
                f"no {count} {method}(s): {self.calls}"
            return self.of(method)


def pem(key: Any) -> str:
    return str(key.private_bytes(serialization.Encoding.PEM,
                                 serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption()).decode())


@pytest.fixture
def google(project: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeGoogle]:
    fake = FakeGoogle()
    account = {"type": "service_account", "project_id": "p", "private_key_id": "a1",
               "private_key": pem(ACCOUNT_KEY), "client_email": "bot@p.iam.gserviceaccount.com",
               "client_id": "1", "token_uri": f"{fake.url}/token"}
    (project / "account.json").write_text(json.dumps(account))
    monkeypatch.setenv("GOOGLE_CHAT_CREDENTIALS", str(project / "account.json"))
    monkeypatch.setenv("GOOGLE_CHAT_API_URL", fake.url)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(GOOGLE_KEY.public_key()))
    (project / "chat-keys.json").write_text(json.dumps(
        {"keys": [{**jwk, "kid": "k1", "alg": "RS256", "use": "sig"}]}))
    write_auth(project, USERS, "chat-auth.yaml", chat="google_chat")
    yield fake
    fake.http.shutdown()
    fake.http.server_close()


@pytest.fixture
def served(project: Path, google: FakeGoogle) -> Iterator[Served]:
    server = Served(project, "--auth", "chat-auth.yaml", "--google-chat-space", "spaces/AAA",
                    "--google-chat-audience", AUDIENCE, "--google-chat-keys",
                    "chat-keys.json")
    yield server
    server.stop()
    assert not [line for line in server.lines if "Traceback" in line], "".join(server.lines)


def token(*, key: Any = GOOGLE_KEY, aud: str = AUDIENCE, iss: str = ISSUER,
          expires: float = 300, alg: str = "RS256") -> str:
    now = int(time.time())
    claims = {"iss": iss, "aud": aud, "iat": now - 10, "exp": now + int(expires)}
    if alg == "none":
        return str(jwt.encode(claims, None, algorithm="none"))
    return str(jwt.encode(claims, key, algorithm="RS256", headers={"kid": "k1"}))


def event(card: dict[str, Any], user: str, kind: str = "approve") -> dict[str, Any]:
    """Google Chat's CARD_CLICKED event for ``card``'s ``kind`` button."""
    buttons = [b for w in card["cardsV2"][0]["card"]["sections"][0]["widgets"]
               if "buttonList" in w for b in w["buttonList"]["buttons"]]
    [button] = [b for b in buttons if "action" in b["onClick"] and
                {"key": "decision", "value": kind} in b["onClick"]["action"]["parameters"]]
    action = button["onClick"]["action"]
    return {"type": "CARD_CLICKED", "eventTime": "2026-12-04T22:00:00Z",
            "user": {"name": user, "displayName": user, "type": "HUMAN"},
            "space": {"name": "spaces/AAA"}, "message": {"name": "spaces/AAA/messages/m2"},
            "action": {"actionMethodName": action["function"],
                       "parameters": action["parameters"]},
            "common": {"invokedFunction": action["function"],
                       "parameters": {p["key"]: p["value"] for p in action["parameters"]}}}


def send(client: Any, body: dict[str, Any], bearer: str | None) -> Any:
    headers = {"Authorization": f"Bearer {bearer}"} if bearer is not None else {}
    return client.post("/api/integrations/google-chat/events", json=body, headers=headers)


def test_a_gate_is_posted_as_a_card_approved_by_a_click_updated_and_the_run_continues(
        served: Served, google: FakeGoogle) -> None:
    with served.client("tok-alice") as c, served.client() as anonymous:
        start(c, "g1")
        [(path, card, headers)] = google.wait("POST")
        assert path == "/v1/spaces/AAA/messages"
        assert headers["Authorization"] == "Bearer ya29.test-token"
        # the token was asked for at the key's token_uri, as a service account asks
        [grant] = [d for m, p, d, _ in google.calls if p == "/token"]
        assert grant["grant_type"] == ["urn:ietf:params:oauth:grant-type:jwt-bearer"]
        text = json.dumps(card["cardsV2"])
        assert "g1" in text and "gate" in text and "/approvals?run_id=g1" in text
        record = posted(c, "g1")
        assert record["via"] == "google-chat"
        assert record["where"]["name"].startswith("spaces/AAA/messages/")

        r = send(anonymous, event(card, "users/111"), token())
        assert r.status_code == 200, r.text
        [(patched, update, _)] = google.wait("PATCH")
        assert patched.startswith(f"/v1/{record['where']['name']}?")
        assert "updateMask=" in patched
        assert "Approved by alice (via google-chat)" in json.dumps(update)
        # the card's first line, subtitle and text say the gate was decided, not waiting
        widgets = update["cardsV2"][0]["card"]["sections"][0]["widgets"]
        assert widgets[0]["textParagraph"]["text"].startswith(
            "gated: run g1: gate approved by alice (via google-chat) at ")
        assert update["cardsV2"][0]["card"]["header"]["subtitle"] == "decided: approved"
        assert update["text"].startswith("gated: run g1: gate approved by alice")
        assert "waiting" not in json.dumps(update)
        assert "buttonList" not in json.dumps(update)
        assert wait_status(c, "g1", "COMPLETED")["state"]["last"] == 4
        [d] = decided(c, "g1")
        assert (d["decision"], d["by"], d.get("via")) == ("approved", "alice", "google-chat")


@pytest.mark.parametrize("case", ["no token", "not a JWT", "alg none", "bad signature",
                                  "wrong audience", "wrong issuer", "expired"])
def test_an_event_whose_token_does_not_verify_is_401_and_records_nothing(
        served: Served, google: FakeGoogle, case: str) -> None:
    bearer = {"no token": None, "not a JWT": "not-a-jwt", "alg none": token(alg="none"),
              "bad signature": token(key=OTHER_KEY), "wrong audience": token(aud="999"),
              "wrong issuer": token(iss="someone@example.com"),
              "expired": token(expires=-600)}[case]
    why = {"no token": "no bearer token", "not a JWT": "DecodeError",
           "alg none": "'none', not RS256", "bad signature": "InvalidSignatureError",
           "wrong audience": "InvalidAudienceError", "wrong issuer": "someone@example.com",
           "expired": "ExpiredSignatureError"}[case]
    with served.client("tok-alice") as c, served.client() as anonymous:
        start(c, "g2")
        [(_, card, _)] = google.wait("POST")
        posted(c, "g2")
        before = c.get("/api/runs/g2/records").json()
        r = send(anonymous, event(card, "users/111"), bearer)
        assert r.status_code == 401, (case, r.text)
        # the caller is told it does not verify; why is in the server's log
        assert r.json()["detail"] == "the request's token does not verify", r.json()
        assert why not in r.text and "--google-chat" not in r.text
        deadline = time.monotonic() + 10
        while not [line for line in served.lines if why in line] and \
                time.monotonic() < deadline:
            time.sleep(0.05)  # (the server's stderr is read by a thread)
        assert [line for line in served.lines if "401" in line and why in line and
                "--google-chat-audience" in line], served.lines[-5:]
        assert c.get("/api/runs/g2/records").json() == before
        assert c.get("/api/runs/g2").json()["status"] == "WAITING_APPROVAL"
        assert not google.of("PATCH")


def test_refused_clicks_record_no_decision_and_a_decision_elsewhere_updates_the_card(
        served: Served, google: FakeGoogle) -> None:
    with served.client("tok-alice") as c, served.client() as anonymous:
        start(c, "g3")
        [(_, card, _)] = google.wait("POST")
        for user, why in [("users/999", "is not mapped to an approver"),
                          ("users/222", "'bob' may not decide 'gate'")]:
            r = send(anonymous, event(card, user), token())
            assert r.status_code == 200, r.text
            answer = r.json()
            assert answer["privateMessageViewer"] == {"name": user}
            assert why in answer["text"]
        assert decided(c, "g3") == []
        assert c.get("/api/runs/g3").json()["status"] == "WAITING_APPROVAL"
        # decided from the API: the card is updated too; a later click is refused
        assert c.post("/api/runs/g3/decisions",
                      json={"decision": "approve"}).status_code == 200
        [(_, update, _)] = google.wait("PATCH")
        assert "Approved by alice (via api)" in json.dumps(update)
        wait_status(c, "g3", "COMPLETED")
        r = send(anonymous, event(card, "users/111", "reject"), token())
        assert r.status_code == 200 and "No decision recorded" in r.json()["text"]
        assert len(decided(c, "g3")) == 1
