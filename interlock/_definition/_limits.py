"""The bounds on what interlock reads and evaluates, in one place.

A workflow file is code (it names Python imports), but run inputs, decisions,
patches and HTTP bodies are data, and a careless file should not exhaust the
machine either. Every limit here has a default and an environment variable that
overrides it (a positive integer); docs/security.md lists them with the reasons
for their defaults.

A limit is read when it is applied, not cached, so a process (or a test) may
change the environment between runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .._errors import UsageError


@dataclass(frozen=True, slots=True)
class Limit:
    """One bound: its environment variable, its default and what it counts."""

    env: str
    default: int
    unit: str
    what: str

    def get(self) -> int:
        raw = os.environ.get(self.env)
        if raw is None or raw.strip() == "":
            return self.default
        try:
            value = int(raw.strip().replace("_", ""))
        except ValueError:
            value = 0
        if value <= 0:
            raise UsageError(
                f"{self.env}={raw!r} is not a positive integer; it sets {self.what} "
                f"(in {self.unit}, default {self.default:_}) -- unset it or give a number"
            )
        return value


MiB = 1024 * 1024

#: bytes of a workflow file (YAML or JSON) read by ``load``/``validate``/``run``
WORKFLOW_FILE_BYTES = Limit(
    "INTERLOCK_MAX_WORKFLOW_BYTES", 4 * MiB, "bytes", "the largest workflow file read")
#: nodes of the YAML document after anchors/aliases are expanded
YAML_NODES = Limit(
    "INTERLOCK_MAX_YAML_NODES", 250_000, "YAML nodes",
    "the size of a workflow document with its aliases expanded")
#: nesting depth of a workflow document (YAML's reader itself stops near 200)
YAML_DEPTH = Limit(
    "INTERLOCK_MAX_YAML_DEPTH", 100, "levels", "the deepest nesting of a workflow document")
#: bytes of a run's input, a decision's patch or a --set value, as JSON
INPUT_BYTES = Limit(
    "INTERLOCK_MAX_INPUT_BYTES", 4 * MiB, "bytes", "the largest run input or patch")
#: nesting depth of a run's input or patch
INPUT_DEPTH = Limit(
    "INTERLOCK_MAX_INPUT_DEPTH", 100, "levels", "the deepest nesting of a run input or patch")
#: the estimated cost of one CEL evaluation (see _expr)
EXPRESSION_COST = Limit(
    "INTERLOCK_MAX_EXPRESSION_COST", 10_000_000, "cost units",
    "the estimated cost of one condition's evaluation")
#: characters of one rendered prompt template
RENDER_CHARS = Limit(
    "INTERLOCK_MAX_PROMPT_CHARS", 1 * MiB, "characters", "the longest rendered prompt")
#: milliseconds one prompt template may take to render
RENDER_MS = Limit(
    "INTERLOCK_MAX_RENDER_MS", 2_000, "milliseconds", "the time one prompt may take to render")

ALL = (WORKFLOW_FILE_BYTES, YAML_NODES, INPUT_BYTES, INPUT_DEPTH, EXPRESSION_COST,
       RENDER_CHARS, RENDER_MS, YAML_DEPTH)
