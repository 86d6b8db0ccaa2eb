#!/usr/bin/env bash
# Create bench/.venv-dbos: DBOS Transact, pinned, in a virtual environment of its own,
# so its dependencies never meet interlock's. bench/run.py runs the DBOS adapter with
# this venv's python (S5 and S8).
#
#     bash bench/setup_dbos.sh            # idempotent: reuses a venv with the pins
#     PYTHON=python3.12 bash bench/setup_dbos.sh   # another base interpreter
set -euo pipefail

# The pin: DBOS Transact 3.4.0, the release current on PyPI when it was added (package
# `dbos`). It brings SQLAlchemy (its system database, SQLite or PostgreSQL) and psycopg
# for PostgreSQL; bench/dbos-constraints.txt pins the rest.
DBOS_VERSION=3.4.0

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
venv="$here/.venv-dbos"
source "$here/_engine_venv.sh"
engine_venv setup_dbos "$venv" "$here/dbos-constraints.txt" "dbos==$DBOS_VERSION" \
    "psycopg[binary]"
if [[ $ENGINE_VENV_READY == 1 ]]; then
    exit 0
fi
"$venv/bin/python" - <<'PY'
import importlib.metadata as md
from dbos import DBOS, DBOSConfig  # noqa: F401
for name in ("dbos", "sqlalchemy", "psycopg"):
    print(f"setup_dbos: {name}=={md.version(name)}")
PY
engine_venv_done
