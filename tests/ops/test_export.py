"""`interlock export` and `interlock verify --file` (SPEC §10): an auditor takes a run
away and proves it without the store."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from interlock import START, Workflow
from interlock.cli import cli


def cli_run(*args: str, env: dict[str, str] | None = None, input: bytes | None = None
            ) -> Result:
    return CliRunner().invoke(cli, list(args), env=env, input=input, catch_exceptions=False)


def a_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str | None = None
          ) -> tuple[str, str]:
    """A finished run with a fan-out, in a store of its own; its id and the store's URL."""
    if key is not None:
        monkeypatch.setenv("INTERLOCK_LOG_KEY", key)
    wf = Workflow("audited", state={"log": "append"})
    wf.node("a", lambda s: {"log": "a", "amount": 120})
    wf.node("b", lambda s: {"log": "b"})
    wf.node("c", lambda s: {"log": "c"})
    wf.edge(START, "a").edge("a", ["b", "c"])
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    result = wf.run_sync(store=store)
    assert result.status == "COMPLETED"
    monkeypatch.delenv("INTERLOCK_LOG_KEY", raising=False)
    return result.run_id, store


def export_to(tmp_path: Path, run_id: str, store: str, env: dict[str, str] | None = None
              ) -> Path:
    out = cli_run("export", run_id, "--store", store, env=env)
    assert out.exit_code == 0, out.output
    path = tmp_path / "run.jsonl"
    path.write_bytes(out.stdout_bytes)
    return path


def test_an_exported_run_verifies_from_the_file_alone(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    run_id, store = a_run(tmp_path, monkeypatch)
    path = export_to(tmp_path, run_id, store)
    lines = path.read_bytes().splitlines()
    head = json.loads(lines[0])
    assert head["format"] == "interlock-run" and head["run_id"] == run_id
    assert head["summary"]["last_seq"] == len(lines) - 1
    assert json.loads(lines[1])["type"] == "run.started"
    # the store is gone: the file is all there is
    (tmp_path / "runs.db").unlink()
    moved = tmp_path / "elsewhere" / "run.jsonl"
    moved.parent.mkdir()
    shutil.move(path, moved)
    monkeypatch.chdir(moved.parent)
    checked = cli_run("verify", "--file", "run.jsonl")
    assert checked.exit_code == 0, checked.output
    assert checked.output.startswith(f"ok: {run_id} ({len(lines) - 1} records")
    piped = cli_run("verify", "--file", "-", input=moved.read_bytes())
    assert piped.exit_code == 0, piped.output


def tampered(path: Path, change: Any) -> Path:
    lines = path.read_bytes().split(b"\n")
    change(lines)
    out = path.with_name("tampered.jsonl")
    out.write_bytes(b"\n".join(lines))
    return out


def edit_amount(lines: list[bytes]) -> None:
    [i] = [k for k, line in enumerate(lines) if b'"amount":120' in line]
    lines[i] = lines[i].replace(b'"amount":120', b'"amount":12')


@pytest.mark.parametrize("change, expected", [
    (edit_amount, "at least one of records 1.."),
    (lambda lines: lines.__delitem__(slice(-3, -1)), "records were cut off the end"),
    (lambda lines: lines.__delitem__(3), "a record is missing or out of order"),
    (lambda lines: lines.__setitem__(0, lines[0].replace(b'"amount"', b'"AMOUNT"')
                                     .replace(b'"log"', b'"LOG"')),
     "does not match the hash recorded when the run started"),
    (lambda lines: lines.__setitem__(0, lines[0].replace(b'"input":{}', b'"input":{"x":1}')),
     "disagree about the run's input"),
])
def test_a_tampered_export_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      change: Any, expected: str) -> None:
    run_id, store = a_run(tmp_path, monkeypatch)
    bad = tampered(export_to(tmp_path, run_id, store), change)
    checked = cli_run("verify", "--file", str(bad))
    assert checked.exit_code == 1, checked.output
    assert checked.output.startswith(f"broken: {run_id} ")
    assert expected in checked.output
    assert "restore" not in checked.output  # (advice for a store's log, not an export's)


def test_a_changed_record_in_an_export_is_reported_as_what_is_known(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An export holds the chain hash only at its end: it cannot say which record was
    changed, and says so, pointing to the store's log -- not at its last record."""
    run_id, store = a_run(tmp_path, monkeypatch)
    bad = tampered(export_to(tmp_path, run_id, store), edit_amount)
    n = len(bad.read_bytes().strip().split(b"\n")) - 1  # (its records: after the header)
    checked = cli_run("verify", "--file", str(bad))
    assert checked.exit_code == 1, checked.output
    assert checked.output.splitlines() == [
        f"broken: {run_id} ({n} records): the records do not hash to the chain hash the "
        f"export's first line ends with: at least one of records 1..{n} was changed (an "
        "export keeps no hash per record to say which); compare with the store's log: "
        f"interlock verify {run_id}",
        "this export is not evidence of the run: export the run again from its store "
        f"once `interlock verify {run_id}` says ok there"]


def test_exporting_a_run_whose_stored_log_was_changed_warns_and_exits_1(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The export still holds what the store holds (the evidence), but a script that
    exports for an auditor learns the log is broken from the exit code."""
    run_id, store = a_run(tmp_path, monkeypatch)
    with sqlite3.connect(tmp_path / "runs.db") as conn:
        [(key, data)] = [(k, d) for k, d in conn.execute("SELECT id, data FROM entries")
                         if '"amount":120' in d]
        conn.execute("UPDATE entries SET data = ? WHERE id = ?",
                     (data.replace('"amount":120', '"amount":12'), key))
    out = CliRunner().invoke(cli, ["export", run_id, "--store", store],
                             catch_exceptions=False)
    assert out.exit_code == 1, out.output
    assert f"the exported log of {run_id} does not verify at record" in out.stderr
    assert b'"amount":12}' in out.stdout_bytes or b'"amount":12,' in out.stdout_bytes
    assert json.loads(out.stdout_bytes.splitlines()[0])["run_id"] == run_id


def test_a_keyed_export_needs_its_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_id, store = a_run(tmp_path, monkeypatch, key="audit-secret")
    env = {"INTERLOCK_LOG_KEY": "audit-secret"}
    path = export_to(tmp_path, run_id, store, env=env)
    ok = cli_run("verify", "--file", str(path), env=env)
    assert ok.exit_code == 0, ok.output
    assert "keyed chain (HMAC-SHA-256) and fold verified" in ok.output
    wrong = cli_run("verify", "--file", str(path), env={"INTERLOCK_LOG_KEY": "guess"})
    assert wrong.exit_code == 1
    none = cli_run("verify", "--file", str(path))
    assert none.exit_code == 1 and none.output.startswith("not verified:")


def test_a_file_that_is_not_an_export_is_a_usage_error(tmp_path: Path) -> None:
    path = tmp_path / "notes.jsonl"
    path.write_text('{"hello": 1}\n')
    out = cli_run("verify", "--file", str(path))
    assert out.exit_code == 2
    assert "is not an interlock run export (made by `interlock export RUN_ID`)" in out.output
    missing = cli_run("verify", "--file", str(tmp_path / "nope.jsonl"))
    assert missing.exit_code == 2 and "cannot read" in missing.output
    both = cli_run("verify", "some-run", "--file", str(path))
    assert both.exit_code == 2 and "not both" in both.output
    empty = tmp_path / "empty.jsonl"  # what `export RUN > FILE` leaves when it fails
    empty.write_bytes(b"")
    out = cli_run("verify", "--file", str(empty))
    assert out.exit_code == 2
    assert "empty.jsonl is empty (no header line), not an interlock run export: did the " \
        "command that wrote it fail?" in " ".join(out.output.split())


def test_an_export_holds_the_runs_children_and_verifies_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    child = Workflow("child", input=["n"]).node("double", lambda s: {"d": s["n"] * 2})
    child.edge(START, "double")
    parent = Workflow("parent").node("plan", lambda s: {"n": 21})
    parent.subworkflow("sub", child, input={"n": "n"}, output="d")
    parent.edge(START, "plan").edge("plan", "sub")
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    result = parent.run_sync(store=store)
    assert result.status == "COMPLETED", result.error
    path = export_to(tmp_path, result.run_id, store)
    lines = path.read_bytes().split(b"\n")
    heads = [json.loads(line) for line in lines if line.startswith(b'{"format"')]
    assert [h["workflow"] for h in heads] == ["parent", "child"]
    assert heads[0]["children"] == [heads[1]["run_id"]]
    ok = cli_run("verify", "--file", str(path))
    assert ok.exit_code == 0, ok.output
    # a child record changed: the child is named as broken
    child_at = [i for i, line in enumerate(lines) if line.startswith(b'{"format"')][1]
    bad = list(lines)
    k = next(i for i in range(child_at + 1, len(bad)) if b'"d":42' in bad[i])
    bad[k] = bad[k].replace(b'"d":42', b'"d":43')
    (tmp_path / "bad.jsonl").write_bytes(b"\n".join(bad))
    broken = cli_run("verify", "--file", str(tmp_path / "bad.jsonl"))
    assert broken.exit_code == 1
    assert broken.output.startswith(f"broken: {heads[1]['run_id']} (")
    # the child left out: refused, naming it
    (tmp_path / "cut.jsonl").write_bytes(b"\n".join(lines[:child_at]) + b"\n")
    cut = cli_run("verify", "--file", str(tmp_path / "cut.jsonl"))
    assert cut.exit_code == 1
    assert f"names the child run {heads[1]['run_id']!r} but does not hold it" in cut.output
