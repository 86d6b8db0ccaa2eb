#!/usr/bin/env bash
# Create bench/.venv-langgraph: LangGraph, pinned, in a virtual environment of its own,
# so its dependencies never meet interlock's. bench/run.py runs the LangGraph adapter
# with this venv's python.
#
#     bash bench/setup_langgraph.sh            # idempotent: reuses a venv with the pins
#     PYTHON=python3.12 bash bench/setup_langgraph.sh   # another base interpreter
set -euo pipefail

# The pins. langgraph-checkpoint-sqlite 3.1.2 is the release current with langgraph
# 1.2.24: both require langgraph-checkpoint>=4.3,<5 (4.3.2 resolves); it brings
# aiosqlite and sqlite-vec. langgraph-checkpoint-postgres 3.2.0 (S8's AsyncPostgresSaver)
# is the current release; it brings psycopg and psycopg-pool (psycopg-binary for libpq).
# bench/langgraph-constraints.txt pins the rest.
LANGGRAPH_VERSION=1.2.24
CHECKPOINT_SQLITE_VERSION=3.1.2
CHECKPOINT_POSTGRES_VERSION=3.2.0

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
venv="$here/.venv-langgraph"
source "$here/_engine_venv.sh"
engine_venv setup_langgraph "$venv" "$here/langgraph-constraints.txt" \
    "langgraph==$LANGGRAPH_VERSION" "langgraph-checkpoint-sqlite==$CHECKPOINT_SQLITE_VERSION" \
    "langgraph-checkpoint-postgres==$CHECKPOINT_POSTGRES_VERSION" "psycopg[binary]" psycopg-pool
if [[ $ENGINE_VENV_READY == 1 ]]; then
    exit 0
fi
"$venv/bin/python" - <<'PY'
import importlib.metadata as md
import langgraph.graph  # noqa: F401
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver  # noqa: F401
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver  # noqa: F401
for name in ("langgraph", "langgraph-checkpoint", "langgraph-checkpoint-sqlite", "aiosqlite",
             "langgraph-checkpoint-postgres", "psycopg", "psycopg-pool"):
    print(f"setup_langgraph: {name}=={md.version(name)}")
PY
engine_venv_done
