"""A worker process: ``python -m interlock._engine._isolation --parent PID [--memory BYTES]
[--crash-fd FD]`` (started by `ProcessPool`)."""

from __future__ import annotations

import sys

from ._worker import _worker_main

if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv[1:]))
