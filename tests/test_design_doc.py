"""docs/design.md is checked, not trusted (issue 26).

- Its module table names every module of `tests/test_layers.py`'s ``LAYERS``, and its
  Layers table puts each in the layer ``LAYERS`` gives it (and names nothing else).
- Every number it states is backed: by a test, by the constant in the code that it
  describes, by the benchmark that measured it, or -- listed here, so that it is seen --
  by why it is not a figure of interlock or why its measurement was not kept. A new
  number in the doc without an entry in ``CLAIMS`` fails, naming the sentence.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from test_layers import LAYERS

REPO = Path(__file__).resolve().parent.parent
DESIGN = REPO / "docs" / "design.md"
TESTS = REPO / "tests"


# -- the module and layer tables ---------------------------------------------------------


def _section(title: str) -> list[str]:
    lines = DESIGN.read_text(encoding="utf-8").splitlines()
    start = lines.index(title)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")),
               len(lines))
    return lines[start + 1:end]


def _covers(token: str) -> tuple[set[str], bool]:
    """The ``LAYERS`` modules a name in the doc stands for, and whether it names them
    exactly (``_store/*``, ``cli/`` stand for a package and all of its modules)."""
    name = token.removesuffix(".py")
    name = "" if name in ("interlock", "__init__") else name.removeprefix("interlock.")
    wildcard = name.endswith(("/*", "/"))
    name = name.removesuffix("*").removesuffix("/").replace("/", ".")
    known = {m for mods in LAYERS.values() for m in mods}
    if wildcard:
        return {m for m in known if m == name or m.startswith(name + ".")}, False
    return ({name} & known), True


def _layer_rows() -> dict[int, list[str]]:
    rows: dict[int, list[str]] = {}
    for line in _section("## Layers"):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].isdigit():
            rows[int(cells[0])] = re.findall(r"`([^`]+)`", cells[1])
    return rows


def test_the_layers_table_is_tests_test_layers() -> None:
    rows = _layer_rows()
    assert sorted(rows) == sorted(LAYERS), (
        f"docs/design.md's Layers table has rows {sorted(rows)}; tests/test_layers.py's "
        f"LAYERS has layers {sorted(LAYERS)}: give each layer one row")
    problems = []
    placed: dict[str, tuple[int, bool]] = {}  # module -> (doc layer, named exactly)
    for layer, tokens in rows.items():
        for token in tokens:
            modules, exact = _covers(token)
            if not modules:
                problems.append(f"layer {layer}'s row names `{token}`, which is no module in "
                                "tests/test_layers.py's LAYERS: remove it or add the module "
                                "there")
            for m in modules:
                if m not in placed or (exact and not placed[m][1]):
                    placed[m] = (layer, exact)
    for layer, modules in LAYERS.items():
        for m in sorted(modules):
            shown = f"`{m or 'interlock'}`" if "." not in m else f"`{m}`"
            if m not in placed:
                problems.append(f"{shown} (layer {layer} in tests/test_layers.py) is missing: "
                                f"add it to the row of layer {layer}")
            elif placed[m][0] != layer:
                problems.append(f"{shown} is in the row of layer {placed[m][0]}, but "
                                f"tests/test_layers.py puts it in layer {layer}: move it (or "
                                "change LAYERS, if the design changed)")
    assert not problems, "docs/design.md, ## Layers:\n  " + "\n  ".join(problems)


def test_the_module_table_names_every_module() -> None:
    named: set[str] = set()
    for line in _section("## The path of a run"):
        if line.startswith("| `"):
            for token in re.findall(r"`([^`]+)`", line.split("|")[1]):
                named |= _covers(token)[0]
    tops = {m.split(".")[0] for mods in LAYERS.values() for m in mods}
    missing = sorted(f"`{t or '__init__'}.py`" if not any(
        m.startswith(t + ".") for mods in LAYERS.values() for m in mods) else f"`{t}/`"
        for t in tops if t not in named)
    assert not missing, ("docs/design.md's module table (| module | owns |) has no row "
                         f"for {', '.join(missing)}: add one saying what it owns")


# -- every number it states ----------------------------------------------------------------


@dataclass(frozen=True)
class ByTest:
    """An existing test backs it: ``tests/test_x.py::test_name``."""

    ref: str


@dataclass(frozen=True)
class Value:
    """The constant of the code the number describes: ``module.name == expected``."""

    module: str
    name: str
    expected: Any


@dataclass(frozen=True)
class Check:
    """A fact of the code checked here (``check()`` is true): ``what`` it is."""

    what: str
    check: Callable[[], bool]


@dataclass(frozen=True)
class Bench:
    """A measured figure (a unit test asserts no timing): where it was measured, and a
    phrase the bench's file holds (its table or its text), if any."""

    path: str
    phrase: str | None = None


@dataclass(frozen=True)
class Unkept:
    """A one-off measurement whose script was not kept: listed, so that it is seen."""

    why: str


@dataclass(frozen=True)
class Prose:
    """Not a figure of interlock: a format's or a dependency's version, arithmetic."""

    why: str


Evidence = ByTest | Value | Check | Bench | Unkept | Prose


def _journal() -> Any:
    return importlib.import_module("interlock._engine._journal")


def _claims() -> Any:
    return importlib.import_module("interlock._ops._claims")


def _pool_default() -> bool:
    from interlock._store._postgres import PostgresStore

    return bool(inspect.signature(PostgresStore.__init__).parameters["max_connections"]
                .default == 10)


def _heartbeat_is_a_third_of_the_lease() -> bool:
    """The lease is renewed every third of it (`_watcher._Watcher`, `_runs._Watcher` at
    f074fc7; a lease keeper's thread, ``_lease``, on fencing's branch)."""
    from interlock._ops import _claims, _execute

    sources = [inspect.getsource(_execute)]
    with contextlib.suppress(ImportError):
        sources.append(inspect.getsource(importlib.import_module("interlock._engine._lease")))
    return any("lease / 3" in s for s in sources) and _claims.LEASE_SECONDS / 3 == 5


def _hash_is_32_bytes_in_sqlite() -> bool:
    from interlock._store import _sqlite_sql, _sqlite_writes

    return "hash BLOB NOT NULL" in _sqlite_sql._SCHEMA and \
        "bytes.fromhex" in inspect.getsource(_sqlite_writes)


def _psycopg_3() -> bool:
    text = (REPO / "pyproject.toml").read_text()
    return re.search(r'"psycopg\[[^\]]*\]>=3', text) is not None


INSTRUCTIONS = Bench("bench/instructions.py")
FLOOR = Bench("bench/README.md", "floor")
# fencing's test (issue 26): the lease kept while a node blocks the event loop
LEASE_KEPT = ByTest("tests/ops/test_two_owners.py::"
                    "test_a_node_blocking_its_loop_past_the_lease_keeps_it")
GENERATIONS = ByTest("tests/store/test_store_conformance.py::test_every_claim_bumps_the_generation")
V2_UPGRADE = ByTest("tests/store/test_store_upgrade.py::"
                    "test_a_version_2_file_gets_the_claims_generation")

# A phrase of docs/design.md (whitespace as one space) holding each number it states,
# and what backs it. Keep the phrases short: the sentence may change around them.
CLAIMS: dict[str, Evidence] = {
    # the house's sizes
    "no module over 600 lines": Value("test_house", "MODULE_LINES", 600),
    "no class over 300": Value("test_house", "CLASS_LINES", 300),
    "function over 60": Value("test_house", "FUNCTION_LINES", 60),
    "under 30 per 1,000 lines": Value("test_house", "ANY_PER_KLOC", 30),
    "at least 8% of": Value("test_house", "ENGINE_COMMENT_SHARE", 0.08),
    # the SQLite store's writes on the event loop's thread
    "the loop yielded after 2 ms of them": Value("interlock._store._sqlite_inline",
                                                 "YIELD_EVERY", 0.002),
    # the SQLite change detector
    "looked at every 10 ms": Value("interlock._store._sqlite_watch", "EVERY", 0.01),
    "and 2 s after": Value("interlock._store._sqlite_watch", "LINGER", 2.0),
    "every 10 ms for 0.25 s": Value("interlock._store._sqlite_watch", "BURST", 0.25),
    "retried from 0.1 s": Value("interlock._store._postgres_listen", "RETRY", 0.1),
    "doubling up to 5 s": Value("interlock._store._postgres_listen", "RETRY_MAX", 5.0),
    "halves of at least 16 writes": Value("interlock._store._postgres_writes", "SPLIT", 16),
    # the module table
    "YAML 1.2": ByTest("tests/definition/test_validate.py::"
                       "test_yaml_1_2_keeps_yes_and_on_as_strings"),
    "(every 500 records or more)": Value("interlock._engine._snapshot", "EVERY", 500),
    # the fold
    "a 10 000-node chain does not recurse": ByTest(
        "tests/engine/test_failpaths.py::test_a_skipped_chain_of_10000_nodes_is_ruled_out_without_"
        "recursion"),
    # the runner
    "attempt + 1": Prose("arithmetic in a picture of a retry"),
    # ... when the store fails
    "(50 ms doubling to 1 s)": Check(
        "_journal's first pause between two tries of an append, and its longest",
        lambda: (_journal().RETRY_FIRST_DELAY, _journal().RETRY_MAX_DELAY) == (0.05, 1.0)),
    "`_journal.RETRY_SECONDS` (10 s": Value("interlock._engine._journal", "RETRY_SECONDS", 10.0),
    "less than the 15 s lease": Value("interlock._ops._claims", "LEASE_SECONDS", 15.0),
    "at most 5 s before": Check("the watcher renews the lease every third of it",
                                lambda: _claims().LEASE_SECONDS / 3 == 5.0),
    "Every 64 inline visits": Value("interlock._engine._runner", "YIELD_EVERY", 64),
    # the hot path
    "on a 1000-node chain": Unkept("a py-spy profile of the bench's S1 chain (bench/run.py)"),
    "costs ~8 µs": Unkept("a micro-benchmark of asyncio.timeout, not kept"),
    "starts only after 0.25 s": Value("interlock._ops._cancel", "CANCEL_POLL_SECONDS", 0.25),
    "~1.3 k instructions": INSTRUCTIONS,
    "a chain node ~5 such calls and a loop iteration ~3": INSTRUCTIONS,
    "OpenSSL 3": Prose("the version of a dependency of CPython"),
    # log format 2 (`_log.FORMAT`)
    "format 1": Prose("the log format's version (`_log.FORMAT`)"),
    "format 2": Prose("the log format's version (`_log.FORMAT`)"),
    "Format 2": Prose("the log format's version (`_log.FORMAT`)"),
    "`format: 2`": Prose("the log format's version (`_log.FORMAT`)"),
    "S1 166.9 k → 108.7 k instructions per node, S3 220.6 k → 167.9 k per iteration":
        Bench("bench/HISTORY.md", "108.7 k"),
    "S3 169.2 k → 162.1 k": Bench("bench/README.md", "162,097"),
    # log format 3
    "format 3": Prose("the log format's version (`_log.FORMAT`)"),
    "Format 3": Prose("the log format's version (`_log.FORMAT`)"),
    "`format: 3`": Prose("the log format's version (`_log.FORMAT`)"),
    '{"type": "node.visited", "node": "step", "visit": 2, "update": {"i": 3}, ..., "when": '
    '{"edge": 1, "expr": "i < 6", "reads": {"i": 3}, "to": ["step"], "value": true}}': ByTest(
        "tests/engine/test_format.py::test_a_format_3_visit_carries_its_when_decision_and_"
        "folds_as_its_format_2_twin"),
    "S3 161.7 k → 142.7 k": Bench("bench/README.md", "142,748"),
    "orjson's 4 KiB buffer": Prose("orjson's own buffer size"),
    "(~3× cheaper than": Unkept("a timeit of the two copies, not kept"),
    "9–15 µs per chain node and 14–24 µs per loop iteration": FLOOR,
    "(1/29–1/54 of LangGraph's); interlock is 2.6–5.2× it": FLOOR,
    "~155–165 k instructions and a loop iteration ~210–215 k": INSTRUCTIONS,
    "saves ~0.5–1.5 k": INSTRUCTIONS,
    "S1 157.1 k → 164.5 k per node (+4.7%), S3 209.9 k → 215.1 k per iteration (+2.5%)":
        INSTRUCTIONS,
    "S1 157.2 k, S3 210.3 k): S1 165.3 k → 158.4 k, S3 215.1 k → 209.1 k": INSTRUCTIONS,
    "(stable to ~1% on a machine whose wall time drifts 2×)": INSTRUCTIONS,
    # guards
    "(~1.5 k instructions)": INSTRUCTIONS,
    # claims and leases (fencing changes how the heartbeat runs: keep these true)
    "(15 s,": Value("interlock._ops._claims", "LEASE_SECONDS", 15.0),
    "renewed every 5 s": Check("the lease is renewed every third of it",
                               _heartbeat_is_a_third_of_the_lease),
    "starts 0.25 s into the run": Value("interlock._ops._cancel", "CANCEL_POLL_SECONDS", 0.25),
    "polls the store every 0.25 s": Value("interlock._ops._cancel", "CANCEL_POLL_SECONDS", 0.25),
    "A run is executed by one owner": LEASE_KEPT,  # (the lease is kept, really)
    "Claim generations (issue 26)": Prose("the issue's number"),
    "a run created claimed has 1": GENERATIONS,
    "gone after 10 s with none": Value("interlock._engine._lease", "IDLE_SECONDS", 10.0),
    "a renewal is one statement every 5 s": Check("the lease is renewed every third of it",
                                                  _heartbeat_is_a_third_of_the_lease),
    "0.05-0.24 ms on SQLite and 0.11 ms on PostgreSQL on loopback": Bench(
        "bench/HISTORY.md", "SQLite 0.05-0.24 ms, PostgreSQL 0.11 ms"),
    # a full SQLite disk
    "checkpoints come every 250 jobs": Value("interlock._store._sqlite_wal", "CHECKPOINT_EVERY",
                                             250),
    # the server's run loops and their watchdog
    "stamps a heartbeat every 0.25 s": Value("interlock.server._loops", "TICK", 0.25),
    "stamp is older than 1 s": Value("interlock.server._loops", "BLOCKED_AFTER", 1.0),
    # snapshots
    "Every 500 records": Value("interlock._engine._snapshot", "EVERY", 500),
    "one record per 32 bytes of the last snapshot, so dumping stays O(1) per record":
        Value("interlock._engine._snapshot", "BYTES_PER_RECORD", 32),
    # stores
    "psycopg 3": Check("pyproject.toml's postgres extra asks for psycopg>=3", _psycopg_3),
    "a pool of up to 10 connections per event loop": Check(
        "PostgresStore's max_connections defaults to 10", _pool_default),
    "(schema version 3;": Value("interlock._store._sqlite_sql", "SCHEMA_VERSION", 3),
    "on upgrade from 2)": V2_UPGRADE,
    "its hash as 32 bytes": Check("SQLite stores the hash as a BLOB of its bytes",
                                  _hash_is_32_bytes_in_sqlite),
    "version 1": ByTest("tests/store/test_store_upgrade.py::"
                      "test_a_version_1_file_is_upgraded_and_reads_back_exactly"),
    "version 2": V2_UPGRADE,  # (the layout 2 introduced; 3 added a column)
    "version-1": ByTest("tests/store/test_store_upgrade.py::"
                      "test_a_changed_version_1_file_is_upgraded_with_its_evidence_kept"),
    "3 MB definition in it an append took 5.6 ms, without 0.16 ms": Unkept(
        "a 300-append micro-benchmark in /tmp (the doc says so)"),
    "(a 300-append micro-benchmark": Unkept("the doc says: a /tmp script, not kept"),
    "64 hex characters: 262 bytes a record": Bench("bench/HISTORY.md", "1,094 B"),
    "1,094 bytes a step (four records) against LangGraph's 1,511": Bench("bench/HISTORY.md",
                                                                         "1,094 B"),
    "Version 2 takes 725 bytes a step (0.48×)": Bench("bench/HISTORY.md",
                                                      "725 B against 1,511 B"),
    "(468 of them)": Bench("bench/HISTORY.md", "725 B"),
    "64 lowercase hex digits": ByTest("tests/store/test_store_upgrade.py::"
                                    "test_a_changed_version_1_file_is_upgraded_with_its_"
                                    "evidence_kept"),
    "about 10 s per million records": Unkept("timed once on a generated file, not kept"),
    "a turn of 200 appends would pay 400": Prose("two round trips per savepoint, counted"),
    "~1.7 µs an append (a 3-record append in a turn of 200: 7.5 µs bare, 9.2 µs under its "
    "savepoint, best of 100 turns), against ~100 µs": Unkept(
        "a micro-benchmark of SQLite savepoints, not kept"),
    "S1 159.3 k → 160.1 k instructions per node, S3 210.8 k → 211.6 k per iteration":
        Bench("bench/HISTORY.md", "159.3 k"),
    "PYTHONHASHSEED=0": Prose("a setting of the measurement"),
    # tamper evidence (issue 26)
    "the server answers 409, not 400,": ByTest(
        "tests/store/test_log_errors.py::test_the_server_answers_409_to_a_broken_log_never_400"),
    "the CLI exits 1 (as `verify` does": ByTest(
        "tests/store/test_log_errors.py::test_the_cli_exits_1_on_a_broken_log_saying_what_to_do"),
    "`verify` exits 1 for both": ByTest(
        "tests/ops/test_tamper.py::test_a_keyed_log_verifies_with_its_key_only"),
    # versions (issue 32)
    "the CLI's exit 2, the server's 409": ByTest(
        "tests/ops/test_versions.py::"
        "test_a_server_with_strict_code_refuses_a_decision_after_the_code_changed"),
    # chat deliveries (issue 30)
    "(no answer, 429, 5xx, Slack's transient errors)": ByTest(
        "tests/server/test_chat_deliveries.py::"
        "test_a_post_that_fails_twice_is_retried_and_each_attempt_is_on_record"),
    # known limits
    "1000-branch fan-out take ~6 s (a million pairs); it now takes ~0.2 s": Unkept(
        "timed when the pairs were made lazy; the property test "
        "(tests/definition/test_properties.py) checks the answers, not the time"),
}

_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
# not numbers the doc states: code, SPEC sections, names with digits (S1, SHA-256,
# utf-8, v1, a commit), the layer table's first column (test above)
_MASKS = (re.compile(r"`[^`]*`"), re.compile(r"§\s?\d+(?:\.\d+)?"),
          re.compile(r"(?<![\w.])(?:[A-Za-z_][A-Za-z_]*-?)+\d[\w]*"),
          re.compile(r"(?<![\w.])\d+[a-f][0-9a-f]{4,}\b"))


def _flat() -> str:
    text = "\n".join(line for line in DESIGN.read_text(encoding="utf-8").splitlines()
                     if not re.match(r"\| \d+ \|", line))
    return re.sub(r"\s+", " ", text)


def _stated(flat: str) -> list[tuple[int, int]]:
    masked = flat
    for mask in _MASKS:
        masked = mask.sub(lambda m: " " * len(m.group()), masked)
    return [m.span() for m in _NUMBER.finditer(masked)]


def test_every_number_in_the_design_doc_is_backed() -> None:
    flat = _flat()
    spans = [(m.start(), m.end()) for phrase in CLAIMS
             for m in re.finditer(re.escape(phrase), flat)]
    loose = [flat[max(a - 50, 0):b + 30] for a, b in _stated(flat)
             if not any(s <= a and b <= e for s, e in spans)]
    assert not loose, ("docs/design.md states numbers that nothing backs; add each to CLAIMS "
                       "in tests/test_design_doc.py (a phrase holding it, and a test, the "
                       "constant it describes, the bench that measured it, or why it is "
                       "not a figure of interlock):\n  ..." + "...\n  ...".join(loose) + "...")


def test_every_claim_is_still_in_the_design_doc() -> None:
    flat = _flat()
    gone = [phrase for phrase in CLAIMS if phrase not in flat]
    assert not gone, ("CLAIMS in tests/test_design_doc.py names phrases docs/design.md no "
                      f"longer holds: {gone}; update or remove them")


def _test_names() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for path in TESTS.rglob("test_*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        out[path.relative_to(REPO).as_posix()] = {n.name for n in ast.walk(tree)
                                     if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
                                     and n.name.startswith("test_")}
    return out


@pytest.mark.parametrize("phrase", sorted(CLAIMS))
def test_each_claim_is_backed(phrase: str) -> None:
    evidence = CLAIMS[phrase]
    where = f"docs/design.md says {phrase!r}"
    if isinstance(evidence, ByTest):
        path, _, name = evidence.ref.partition("::")
        assert name in _test_names().get(path, set()), \
            f"{where}, backed by {evidence.ref}, which does not exist: point CLAIMS at its test"
    elif isinstance(evidence, Value):
        actual = getattr(importlib.import_module(evidence.module), evidence.name)
        assert actual == evidence.expected, (
            f"{where}, but {evidence.module}.{evidence.name} is {actual!r}: change the doc "
            "(and CLAIMS) or the code")
    elif isinstance(evidence, Check):
        assert evidence.check(), f"{where}, but it is no longer so: {evidence.what}"
    elif isinstance(evidence, Bench):
        path = REPO / evidence.path
        assert path.exists(), f"{where}, measured by {evidence.path}, which is gone"
        if evidence.phrase is not None:
            assert evidence.phrase in path.read_text(encoding="utf-8"), \
                f"{where}, but {evidence.path} no longer has {evidence.phrase!r}"
    else:
        assert evidence.why, where  # Unkept, Prose: the reason is the record
