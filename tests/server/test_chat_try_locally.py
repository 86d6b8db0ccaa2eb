"""docs/server.md's "Try it without a workspace" holds: examples/chatops/slack_click.py's
fake Slack Web API receives a real ``interlock serve``'s gate message and prints the
``click`` command of each button; that command, run as printed, signs a click as Slack
does and the server decides the gate (and answers a refused click through the fake).
The same for examples/chatops/google_chat_click.py (its fake Chat API and token
endpoint, its own key for --google-chat-keys), and the CARD_CLICKED event the doc
shows."""

from __future__ import annotations

import hashlib
import json
import shlex
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_google_chat import AUDIENCE, FakeGoogle, google, send, token  # noqa: F401
from test_server import Served, wait_status
from test_slack import USERS, decided, posted, project, start  # noqa: F401 (fixtures)

pytest.importorskip("slack_sdk")

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "chatops" / "slack_click.py"
SECRET = "try-secret"


class Printed:
    """A subprocess's stdout, line by line, as it comes."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc, self.lines, self.changed = proc, [], threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.changed:
                self.lines.append(line.rstrip("\n"))
                self.changed.notify_all()

    def wait(self, text: str) -> str:
        with self.changed:
            assert self.changed.wait_for(lambda: any(text in x for x in self.lines), 30), \
                (text, self.lines)
            return next(x for x in self.lines if text in x)


@pytest.fixture
def fake(project: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Printed]:  # noqa: F811
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "fake-api", "--port", "0"],
                            stdout=subprocess.PIPE, text=True)
    printed = Printed(proc)
    base = printed.wait("fake Slack Web API on ").split(" on ", 1)[1].split()[0]
    monkeypatch.setenv("SLACK_API_URL", base)
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-fake")
    monkeypatch.setenv("SLACK_SIGNING_SECRET", SECRET)
    auth = {"tokens": [{"name": n, "sha256": hashlib.sha256(t.encode()).hexdigest(),
                        "roles": r, **({"slack": u} if u else {})}
                       for n, (t, r, u) in USERS.items()]}
    (project / "chat-auth.yaml").write_text(json.dumps(auth))
    yield printed
    proc.terminate()
    proc.wait(30)
    printed.reader.join(30)
    assert proc.stdout is not None
    proc.stdout.close()


def press(printed: str, server: str, user: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """Run a ``click`` command as fake-api printed it, for ``user`` on ``server``."""
    args = shlex.split(printed.split("] ", 1)[1])
    assert args[0] == "python" and args[2] == "click", args
    args[args.index("--server") + 1] = server
    args[args.index("USER")] = user
    return subprocess.run([sys.executable, *args[1:], *extra], capture_output=True,
                          text=True, timeout=60)


def test_the_fake_api_and_a_signed_click_decide_a_gate(project: Path, fake: Printed) -> None:  # noqa: F811
    served = Served(project, "--auth", "chat-auth.yaml", "--slack-channel", "C0TRY")
    try:
        with served.client("tok-alice") as c:
            start(c, "t1")
            fake.wait("posted message")
            approve = fake.wait("[Approve] python ")
            assert '"request": ' in approve and '"gate": "gate"' in approve
            # a user the server does not map: 200, answered through the response_url
            refused = press(approve, served.url, "UNOBODY")
            assert refused.stdout.startswith("200"), refused
            assert "not mapped to an approver" in fake.wait("answered (ephemeral")
            # the wrong secret: 401, and the caller is told no more than that
            wrong = press(approve, served.url, "UALICE", "--secret", "not-it")
            assert wrong.returncode == 1 and wrong.stdout.startswith("401"), wrong
            assert "does not verify" in wrong.stdout
            assert c.get("/api/runs/t1").json()["status"] == "WAITING_APPROVAL"
            # the mapped approver: decided, the run goes on, the message is updated
            done = press(approve, served.url, "UALICE")
            assert done.returncode == 0 and done.stdout.startswith("200"), done
            wait_status(c, "t1", "COMPLETED")
            fake.wait("updated message")
            assert fake.wait("  Approved by ").strip().startswith(
                "Approved by alice (via slack) at ")
    finally:
        served.stop()


def documented_event(run_id: str, gate: str, request: int) -> dict[str, object]:
    """The CARD_CLICKED event docs/server.md shows, for ``run_id``'s ``gate``."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "server.md").read_text()
    part = text.split("### Try it without a workspace", 1)[1]
    start = part.index('    {"type": "CARD_CLICKED"')
    block = part[start:part.index("\n\n", start)]
    shown = json.dumps(json.loads(block))
    for was, now in (('"demo"', json.dumps(run_id)), ('"approval"', json.dumps(gate)),
                     ('"9"', json.dumps(str(request)))):
        assert was in shown, was
        shown = shown.replace(was, now)
    event: dict[str, object] = json.loads(shown)
    return event


def test_the_documented_google_chat_event_decides_a_gate(
        project: Path, google: FakeGoogle) -> None:  # noqa: F811
    served = Served(project, "--auth", "chat-auth.yaml", "--google-chat-space", "spaces/AAA",
                    "--google-chat-audience", AUDIENCE, "--google-chat-keys",
                    "chat-keys.json")
    try:
        with served.client("tok-alice") as c, served.client() as anonymous:
            start(c, "t2")
            google.wait("POST")
            request = posted(c, "t2")["request"]
            r = send(anonymous, documented_event("t2", "gate", request), token())
            assert r.status_code == 200 and r.json() == {}, r.text
            wait_status(c, "t2", "COMPLETED")
            [d] = decided(c, "t2")
            assert (d["by"], d["via"]) == ("alice", "google-chat")
    finally:
        served.stop()


GSCRIPT = SCRIPT.with_name("google_chat_click.py")


def test_the_google_chat_fake_api_and_a_signed_click_decide_a_gate(
        project: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    pytest.importorskip("jwt")
    keys = project / "gchat"
    proc = subprocess.Popen([sys.executable, str(GSCRIPT), "fake-api", "--port", "0",
                             "--dir", str(keys)], stdout=subprocess.PIPE, text=True)
    printed = Printed(proc)
    try:
        for name, value in (x.split("=", 1) for x in
                            printed.wait("export ").removeprefix("export ").split()):
            monkeypatch.setenv(name, value)
        options = shlex.split(printed.wait("serve with: ").removeprefix("serve with: "))
        auth = {"tokens": [{"name": "alice", "roles": ["approver"], "google_chat": "users/111",
                            "sha256": hashlib.sha256(b"tok-alice").hexdigest()},
                           {"name": "olga", "roles": ["operator"],
                            "sha256": hashlib.sha256(b"tok-olga").hexdigest()}]}
        (project / "chat-auth.yaml").write_text(json.dumps(auth))
        served = Served(project, "--auth", "chat-auth.yaml", *options)
        try:
            with served.client("tok-alice") as c:
                start(c, "t3")
                approve = printed.wait("[Approve] python ")
                refused = press(approve, served.url, "users/999")
                assert refused.stdout.startswith("200") and \
                    "not mapped to an approver" in refused.stdout, refused
                done = press(approve, served.url, "users/111")
                assert done.returncode == 0 and done.stdout.startswith("200 {}"), done
                wait_status(c, "t3", "COMPLETED")
                assert printed.wait("  Approved by ").strip().startswith(
                    "Approved by alice (via google-chat) at ")
        finally:
            served.stop()
    finally:
        proc.terminate()
        proc.wait(30)
        printed.reader.join(30)
        assert proc.stdout is not None
        proc.stdout.close()
