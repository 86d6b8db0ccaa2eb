#!/usr/bin/env bash
# Create bench/.venv-langgraph: LangGraph, pinned, in a virtual environment of its own,
# so its dependencies never meet interlock's. bench/run.py runs the LangGraph adapter
# with this venv's python.
#
#     bash bench/setup_langgraph.sh            # idempotent: reuses a venv with the pins
#     PYTHON=python3.12 bash bench/setup_langgraph.sh   # another base interpreter
#
# The base interpreter defaults to the one interlock's venv (.venv) was made from, so
# both engines run on the same CPython build.
set -euo pipefail

# The pins. langgraph-checkpoint-sqlite 3.1.2 is the release current with langgraph
# 1.2.24: both require langgraph-checkpoint>=4.3,<5 (4.3.2 resolves); it brings
# aiosqlite and sqlite-vec. bench/langgraph-constraints.txt (a pip freeze of a working
# setup) pins every transitive dependency too.
LANGGRAPH_VERSION=1.2.24
CHECKPOINT_SQLITE_VERSION=3.1.2

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
venv="$here/.venv-langgraph"
constraints="$here/langgraph-constraints.txt"

if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$root/.venv/bin/python" ]]; then
        PYTHON=$("$root/.venv/bin/python" -c 'import sys; print(sys._base_executable)')
    elif command -v python3.11 >/dev/null; then
        PYTHON=python3.11
    else
        PYTHON=python3
    fi
fi

want="langgraph==$LANGGRAPH_VERSION langgraph-checkpoint-sqlite==$CHECKPOINT_SQLITE_VERSION"
stamp="$venv/.bench-pins"
if [[ -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    echo "setup_langgraph: $venv already has $want" >&2
    exit 0
fi

echo "setup_langgraph: creating $venv with $PYTHON" >&2
rm -rf "$venv"
"$PYTHON" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
args=(--quiet --disable-pip-version-check
      "langgraph==$LANGGRAPH_VERSION" "langgraph-checkpoint-sqlite==$CHECKPOINT_SQLITE_VERSION")
if [[ -f "$constraints" ]]; then
    args+=(--constraint "$constraints")
fi
"$venv/bin/python" -m pip install "${args[@]}"
"$venv/bin/python" - <<'EOF'
import importlib.metadata as md
import langgraph.graph  # noqa: F401
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver  # noqa: F401
for name in ("langgraph", "langgraph-checkpoint", "langgraph-checkpoint-sqlite", "aiosqlite"):
    print(f"setup_langgraph: {name}=={md.version(name)}")
EOF
echo "$want" > "$stamp"
