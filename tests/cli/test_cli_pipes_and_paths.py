"""Review 40's smaller notes on the command line: a command whose stdout's reader went
away (``interlock status RUN | head -1``) ends with its own exit code, quietly (it
exited 1, Click's answer to a BrokenPipeError); a bare file path given as ``--store``
is answered with the SQLite URL of that file.

Real ``python -m interlock`` processes whose stdout pipe is closed before they write.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import CliProject
from test_parallel_gates import NODES, PARALLEL

from interlock.cli import cli


def _closed_stdout(p: CliProject, *args: str) -> tuple[int, str]:
    """Run ``interlock ARGS`` with its stdout a pipe whose reader is gone."""
    proc = subprocess.Popen([sys.executable, "-m", "interlock", *args, "--store", p.store],
                            cwd=p.root, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # (as `| head -1` after its line: every write finds it closed)
    with proc.stderr:
        err = proc.stderr.read()
    return proc.wait(60), err


def test_a_closed_stdout_ends_the_command_with_its_own_exit_code(
        make_project: Callable[..., CliProject]) -> None:
    p = make_project(NODES)
    assert p.cli("run", p.workflow(PARALLEL), "--run-id", "pipe-1").exit_code == 3
    for args in (("status", "pipe-1"), ("status", "pipe-1", "--json"), ("trace", "pipe-1"),
                 ("runs",)):
        code, err = _closed_stdout(p, *args)
        assert code == (3 if args[0] == "status" else 0), (args, code, err)  # 3: waiting
        assert "Traceback" not in err and "BrokenPipe" not in err, err


@pytest.mark.parametrize(("given", "url"), [
    ("/tmp/x40/n.db", "sqlite:////tmp/x40/n.db"),
    ("./n.db", "sqlite:///n.db"),
    ("runs/n.db", "sqlite:///runs/n.db"),
])
def test_a_bare_path_as_store_is_told_its_sqlite_url(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: str, url: str) -> None:
    monkeypatch.chdir(tmp_path)
    said = CliRunner().invoke(cli, ["runs", "--store", given])
    assert said.exit_code == 2, said.output
    assert f"unknown store URL {given!r}: a store URL starts with its kind; for the SQLite " \
        f"file {given}, use {url}" in said.output
    assert not Path("/tmp/x40").exists()  # nothing was created
