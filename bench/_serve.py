"""What the server benchmarks share: ``interlock serve`` started on a free loopback port."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def served(root: Path, *args: str) -> Iterator[str]:
    """``interlock serve --port 0 ARGS`` in ``root`` (its node modules importable, before
    the tree ``$PYTHONPATH`` names); its URL, until SIGTERM at the end."""
    with served_process(root, *args) as (url, _):
        yield url


@contextlib.contextmanager
def served_process(root: Path, *args: str, python: tuple[str, ...] = ("-m", "interlock"),
                   stdout: int | None = None
                   ) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """`served`, with the server's process (its pid for /proc); ``python``: what the
    interpreter runs instead of ``-m interlock`` (``serve --port 0 ARGS`` follow);
    ``stdout``: where its standard output goes (the access log; default: ours)."""
    server = subprocess.Popen([sys.executable, *python, "serve", "--port", "0",
                               *args], cwd=root, text=True, stderr=subprocess.PIPE, stdout=stdout,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                  p for p in (str(root), os.environ.get("PYTHONPATH"))
                                  if p)})
    assert server.stderr is not None
    url = ""
    for line in server.stderr:
        m = re.search(r"(http://127\.0\.0\.1:\d+)", line)
        if m:
            url = m.group(1)
            break
    threading.Thread(target=server.stderr.read, daemon=True).start()
    try:
        yield url, server
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait()
