"""Schemathesis against a real server's /openapi.json: generated requests (valid and
not) get no 5xx, and every response fits the schema the server publishes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis")
pytest.importorskip("fastapi")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_server import GATED, NODES, Served  # noqa: E402


@pytest.fixture(scope="module")
def api_schema(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    root: Path = tmp_path_factory.mktemp("schema")
    (root / "snodes.py").write_text(NODES)
    (root / "flows").mkdir()
    (root / "flows" / "gated.yaml").write_text(GATED)
    server = Served(root)
    try:
        yield schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    finally:
        server.stop()


def test_the_api_keeps_to_its_schema(api_schema: Any) -> None:
    """Every operation, with generated requests (schemathesis's strategies, run by
    hypothesis here: its pytest plugin does not work with this pytest)."""
    checked = []
    modes = [schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE]
    for result in api_schema.get_all_operations():
        operation = result.ok()

        @given(st.one_of(*(operation.as_strategy(mode) for mode in modes)))
        @settings(max_examples=25, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        def check(case: Any) -> None:
            case.call_and_validate(timeout=10)

        check()
        checked.append(operation.label)
    assert len(checked) >= 12, checked
