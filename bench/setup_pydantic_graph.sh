#!/usr/bin/env bash
# Create bench/.venv-pydantic-graph: pydantic-graph, pinned, in a virtual environment of
# its own, so its dependencies never meet interlock's or LangGraph's. bench/run.py runs
# the pydantic-graph adapter with this venv's python.
#
#     bash bench/setup_pydantic_graph.sh            # idempotent: reuses a venv with the pins
#     PYTHON=python3.12 bash bench/setup_pydantic_graph.sh   # another base interpreter
#
# The base interpreter defaults to the one interlock's venv (.venv) was made from, so
# every engine runs on the same CPython build.
set -euo pipefail

# The pin: the release current on PyPI when the engine was added. It needs anyio,
# logfire-api (a no-op shim unless Logfire is installed, which it is not here), pydantic
# and typing-inspection; bench/pydantic-graph-constraints.txt (a pip freeze of a working
# setup) pins every transitive dependency too.
PYDANTIC_GRAPH_VERSION=2.68.0

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
venv="$here/.venv-pydantic-graph"
constraints="$here/pydantic-graph-constraints.txt"

if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$root/.venv/bin/python" ]]; then
        PYTHON=$("$root/.venv/bin/python" -c 'import sys; print(sys._base_executable)')
    elif command -v python3.11 >/dev/null; then
        PYTHON=python3.11
    else
        PYTHON=python3
    fi
fi

want="pydantic-graph==$PYDANTIC_GRAPH_VERSION"
stamp="$venv/.bench-pins"
if [[ -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    echo "setup_pydantic_graph: $venv already has $want" >&2
    exit 0
fi

echo "setup_pydantic_graph: creating $venv with $PYTHON" >&2
rm -rf "$venv"
"$PYTHON" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
args=(--quiet --disable-pip-version-check "pydantic-graph==$PYDANTIC_GRAPH_VERSION")
if [[ -f "$constraints" ]]; then
    args+=(--constraint "$constraints")
fi
"$venv/bin/python" -m pip install "${args[@]}"
"$venv/bin/python" - <<'PY'
import importlib.metadata as md
from pydantic_graph import BaseNode, End, GraphBuilder  # noqa: F401
for name in ("pydantic-graph", "pydantic", "anyio", "logfire-api"):
    print(f"setup_pydantic_graph: {name}=={md.version(name)}")
PY
echo "$want" > "$stamp"
