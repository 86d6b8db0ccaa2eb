#!/usr/bin/env bash
# Create bench/.venv-pydantic-graph: pydantic-graph, pinned, in a virtual environment of
# its own, so its dependencies never meet interlock's or LangGraph's. bench/run.py runs
# the pydantic-graph adapter with this venv's python.
#
#     bash bench/setup_pydantic_graph.sh            # idempotent: reuses a venv with the pins
#     PYTHON=python3.12 bash bench/setup_pydantic_graph.sh   # another base interpreter
set -euo pipefail

# The pin: the release current on PyPI when the engine was added. It needs anyio,
# logfire-api (a no-op shim unless Logfire is installed, which it is not here), pydantic
# and typing-inspection; bench/pydantic-graph-constraints.txt pins the rest.
PYDANTIC_GRAPH_VERSION=2.68.0

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
venv="$here/.venv-pydantic-graph"
source "$here/_engine_venv.sh"
engine_venv setup_pydantic_graph "$venv" "$here/pydantic-graph-constraints.txt" \
    "pydantic-graph==$PYDANTIC_GRAPH_VERSION"
if [[ $ENGINE_VENV_READY == 1 ]]; then
    exit 0
fi
"$venv/bin/python" - <<'PY'
import importlib.metadata as md
from pydantic_graph import BaseNode, End, GraphBuilder  # noqa: F401
for name in ("pydantic-graph", "pydantic", "anyio", "logfire-api"):
    print(f"setup_pydantic_graph: {name}=={md.version(name)}")
PY
engine_venv_done
