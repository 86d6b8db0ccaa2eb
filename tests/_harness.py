"""Harness pieces several test files share: waiting for another process's progress, a
`CliProject`'s workflows served by a real ``interlock serve``, a run started through the
API up to its gates, and CLI processes released at the same moment (a race)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from conftest import CliProject
from test_decision_race import LAUNCH

if TYPE_CHECKING:
    from test_server import Served


REPO = Path(__file__).resolve().parents[1]


def wait_for(what: Callable[[], bool], why: str, timeout: float = 60,
             every: float = 0.02, alive: subprocess.Popen[bytes] | None = None) -> None:
    """Poll another process's progress (a file it writes, its log, a server's answer)
    until ``what``; fail naming ``why`` after ``timeout`` seconds, or as soon as the
    process ``alive`` (the one that should get there) has ended."""
    until = time.monotonic() + timeout
    while not what():
        if alive is not None:
            assert alive.poll() is None, f"the process ended before {why}"
        if time.monotonic() > until:
            raise AssertionError(f"timed out waiting for {why}")
        time.sleep(every)


def interlock_process(root: Path, *args: str, **popen: Any) -> subprocess.Popen[bytes]:
    """``interlock ARGS`` in a process of its own in ``root``, importing ``root``'s node
    modules and this checkout's interlock; its output is discarded (``popen``: more of
    `subprocess.Popen`'s arguments, e.g. ``stdin``)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(REPO)])}
    return subprocess.Popen([sys.executable, "-m", "interlock", *args], cwd=root, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **popen)


def write_auth(root: Path, tokens: Mapping[str, tuple[Any, ...]], name: str = "auth.yaml",
               chat: str | None = None) -> None:
    """``root/NAME``, the server's ``--auth`` file: each of ``tokens`` (name: (token,
    roles)) by the SHA-256 of its token; with ``chat`` (``slack``, ``google_chat``), each
    is (token, roles, its user in that chat or None)."""
    rows = []
    for n, (t, r, *user) in tokens.items():
        row = {"name": n, "sha256": hashlib.sha256(t.encode()).hexdigest(), "roles": r}
        if chat and user[0]:
            row[chat] = user[0]
        rows.append(row)
    (root / name).write_text(json.dumps({"tokens": rows}))


def write_folder(root: Path, modules: dict[str, str], flows: dict[str, str],
                 tokens: dict[str, tuple[str, list[str]]] | None = None) -> Path:
    """``root`` as ``interlock serve`` (or a worker) finds it: each node module of
    ``modules`` as ``NAME.py``, each workflow text of ``flows`` as ``flows/NAME.yaml``
    (both dedented) and, with ``tokens``, its `write_auth` ``auth.yaml``."""
    for name, text in modules.items():
        (root / f"{name}.py").write_text(textwrap.dedent(text))
    (root / "flows").mkdir()
    for name, text in flows.items():
        (root / "flows" / f"{name}.yaml").write_text(textwrap.dedent(text))
    if tokens is not None:
        write_auth(root, tokens)
    return root


def cli_root(root: Path, monkeypatch: pytest.MonkeyPatch, modules: dict[str, str],
             flows: dict[str, str]) -> Path:
    """``root`` holding `write_folder`'s files, as the working directory of CLI commands
    run in this process (its node modules importable), with no store, server, token or
    log key from the outside."""
    for name in ("INTERLOCK_STORE", "INTERLOCK_SERVER", "INTERLOCK_TOKEN",
                 "INTERLOCK_LOG_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.chdir(root)
    return write_folder(root, modules, flows)


def write_flows(p: CliProject, **flows: str) -> None:
    """Each text of ``flows`` as ``flows/NAME.yaml`` under ``p``'s root (``{mod}`` naming
    its node module, as `CliProject.workflow` writes it): the folder a server serves."""
    (p.root / "flows").mkdir()
    for name, text in flows.items():
        (p.root / "flows" / f"{name}.yaml").write_text(
            textwrap.dedent(text).replace("{mod}", p.mod))


def serve(p: CliProject, **flows: str) -> Served:
    """A real ``interlock serve`` on ``p``'s store serving ``flows`` (`write_flows`); the
    caller stops it."""
    from test_server import Served  # (the server tests' harness skips without httpx)

    write_flows(p, **flows)
    return Served(p.root, store=p.store)


def started_waiting(http: Any, workflow: str, run_id: str) -> None:
    """Start ``run_id`` of ``workflow`` through the API; wait until it waits at a gate."""
    made = http.post(f"/api/workflows/{workflow}/runs", json={"run_id": run_id})
    assert made.status_code == 201, made.text
    wait_for(lambda: http.get(f"/api/runs/{run_id}").json()["status"]
             == "WAITING_APPROVAL", f"run {run_id} to wait")


def problem(answer: Any, status: int) -> str:
    """The ``detail`` of an API's problem+json answer, which must have ``status``."""
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"].startswith("application/problem+json")
    detail = answer.json()["detail"]
    assert isinstance(detail, str)
    return detail


def released_together(cwd: Path, commands: list[list[str]], timeout: float = 120
                      ) -> list[subprocess.CompletedProcess[str]]:
    """Each command (``interlock`` arguments) in a process of its own, all released at
    the same moment: each waits for one byte on its stdin before it runs (`LAUNCH`).
    Their outcomes, in the order given."""
    procs = [subprocess.Popen(
        [sys.executable, "-c", LAUNCH, *args],
        cwd=cwd, env=dict(os.environ), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True) for args in commands]
    for proc in procs:  # each waits for one byte on stdin: released together
        assert proc.stdin is not None
        proc.stdin.write("x")
        proc.stdin.flush()
    outs = [proc.communicate(timeout=timeout) for proc in procs]
    return [subprocess.CompletedProcess(proc.args, proc.returncode, o, e)
            for proc, (o, e) in zip(procs, outs, strict=True)]
