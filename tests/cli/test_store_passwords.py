"""A store's password is never in a printed command: hints are copied into chats, tickets
and shell history. The command carries the URL without it (PostgreSQL's own tools find
it in ``PGPASSWORD`` or ``~/.pgpass``, as the store's connection does), and a store named
by ``$INTERLOCK_STORE`` is not printed at all."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner
from test_server import pythonpath
from test_store_conformance import pg_schema_url  # noqa: F401 (a fixture)

from interlock._hints import without_password
from interlock.cli import cli
from interlock.cli._format import where_options
from interlock.support import store_word

SECRET = "s3cret-Xq9"

GATED = """
workflow: gated
nodes:
  check: {call: "pwnodes:check", writes: [checked]}
  gate: {approval: {show: [checked]}}
edges:
  - {from: START, to: check}
  - {from: check, to: gate}
  - {from: gate, to: END}
"""


def test_a_url_loses_its_password_and_keeps_the_rest() -> None:
    assert without_password(f"postgresql://app:{SECRET}@db.internal:5432/runs"
                            "?sslmode=require") == \
        "postgresql://app@db.internal:5432/runs?sslmode=require"
    assert without_password(f"postgresql://db/runs?password={SECRET}&sslmode=require") == \
        "postgresql://db/runs?sslmode=require"
    assert without_password(f"postgresql://:{SECRET}@db/runs") == "postgresql://db/runs"
    assert without_password(f"postgresql://app:{SECRET}@[::1]:5432/runs") == \
        "postgresql://app@[::1]:5432/runs"
    assert without_password(f"postgresql://app:{SECRET}@db/runs", "***") == \
        "postgresql://app:***@db/runs"
    for kept in ("sqlite:////srv/runs.db", "sqlite:///rel.db", "memory://",
                 "postgresql://app@db/runs"):
        assert without_password(kept) == kept


def test_printed_store_options_carry_no_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("INTERLOCK_STORE", raising=False)
    url = f"postgresql://app:{SECRET}@db/runs"
    assert where_options(url) == " --store postgresql://app@db/runs"
    assert store_word("sqlite:///my runs.db") == "'sqlite:///my runs.db'"
    # named by the environment: the next command reads it again
    monkeypatch.setenv("INTERLOCK_STORE", url)
    assert where_options(url) == ""
    pytest.importorskip("mcp")
    from interlock.mcp._local import LocalRuns

    runs = LocalRuns({}, SimpleNamespace(url=url))  # type: ignore[arg-type]
    assert runs.store_hint == " --store postgresql://app@db/runs"


@pytest.fixture
def pg_url_with_password(pg_schema_url: str) -> Iterator[str]:  # noqa: F811
    """The test database's URL with a password in it (the test server trusts loopback,
    so any password is accepted: what matters here is where it is printed)."""
    url = re.sub(r"^postgresql://([^@/:]+)@", rf"postgresql://\1:{SECRET}@", pg_schema_url)
    assert SECRET in url, pg_schema_url
    yield url


def test_hints_after_a_run_on_postgresql_never_print_its_password(
        pg_url_with_password: str, tmp_path: Path) -> None:
    (tmp_path / "pwnodes.py").write_text("def check(state):\n    return {'checked': 1}\n")
    (tmp_path / "gated.yaml").write_text(GATED)
    env = {k: v for k, v in os.environ.items() if k != "INTERLOCK_STORE"}
    env |= {"PYTHONPATH": pythonpath(tmp_path), "PGPASSWORD": SECRET}

    def interlock(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "interlock", *args], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=120)

    ran = interlock("run", "gated.yaml", "--run-id", "p1", "--store", pg_url_with_password)
    assert ran.returncode == 3, ran.stderr
    status = interlock("status", "p1", "--store", pg_url_with_password)
    for out in (ran, status):
        assert SECRET not in out.stdout + out.stderr
    [hint] = [line.split("decide with: ", 1)[1] for line in ran.stdout.splitlines()
              if "decide with: " in line]
    command = shlex.split(hint.split(" (or ")[0])
    assert command[-2] == "--store" and SECRET not in command[-1]
    decided = interlock(*command[1:])  # pasted as printed (the password from PGPASSWORD)
    assert decided.returncode == 0, decided.stderr
    assert SECRET not in decided.stdout + decided.stderr
    assert "--store 'postgresql://postgres@" in status.stdout  # (each of its commands)


def test_a_pasted_command_without_the_password_says_where_it_is_read_from(
        make_project: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server answers a login without a password (PGPASSWORD unset) as libpq says
    it; the error says where the password is read from, not that the server is down."""
    psycopg = pytest.importorskip("psycopg")

    async def refused(*args: Any, **kwargs: Any) -> Any:
        raise psycopg.OperationalError(
            'connection failed: connection to server at "10.0.0.5", port 5432 failed: '
            "fe_sendauth: no password supplied")

    monkeypatch.setattr(psycopg.AsyncConnection, "connect", refused)
    make_project("")  # (no store or log key from the environment)
    out = CliRunner().invoke(cli, ["status", "r1", "--store", "postgresql://app@10.0.0.5/runs"])
    assert out.exit_code == 2, out.output
    assert "the server refused the login (" in out.output
    assert "PGPASSWORD or ~/.pgpass" in out.output
    assert "unreachable" not in out.output
