"""Failures a resume can never fix: the cause is a decision or an ended child run in the
log, not the code, the limits or the config a resume could change -- a rejected
``unknown_outcome`` gate (the action recorded as not done), a child run rejected or
cancelled (a mapped sub-workflow whose child's gate was rejected). A resume of such a
run is refused before anything is recorded (it used to append ``run.resumed``,
``node.failed`` and ``run.failed`` each time, failing the same way), and the CLI points
to ``interlock fork`` instead of ``interlock resume``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def final_failure(error: Mapping[str, Any] | None) -> str | None:
    """Why a run that failed with ``error`` (its ``RunError.to_json``) would fail the
    same way on every resume; None when a resume may help."""
    if not isinstance(error, Mapping):
        return None
    details = error.get("details")
    details = details if isinstance(details, Mapping) else {}
    kind = error.get("type")
    if kind == "unknown_outcome":
        return (f"a person recorded the action of {error.get('node')!r}, whose outcome was "
                "unknown, as not done (rejected at its unknown_outcome gate): that decision "
                "is final")
    if kind != "child_failed":
        return None
    child, status = details.get("child_run"), details.get("child_status")
    if status in ("REJECTED", "CANCELLED"):
        return (f"node {error.get('node')!r}: its child run {child} was {status.lower()}, "
                "and an ended child run is never continued")
    inner = final_failure(details.get("child_error"))
    if inner is not None:
        return f"node {error.get('node')!r}: its child run {child} failed for good: {inner}"
    return None


def refusal(run_id: str, why: str) -> str:
    """The message of a refused resume of a run that failed for good."""
    return (f"run {run_id!r} failed for good: {why}; a resume would fail the same way, so it "
            "is refused and nothing is recorded. To try again from before the decision, "
            f"start a new run from one of its records: `interlock fork {run_id} --at SEQ` "
            f"(`interlock trace {run_id}` lists the records)")


def unknown_note(kind: str | None) -> str:
    """What a plain resume's refusal adds about an ``unknown_outcome`` gate."""
    if kind != "unknown_outcome":
        return ""
    return (" (an action whose outcome is unknown: the process running it died; --approve "
            "runs it AGAIN, --reject records it as not done, --approve --data "
            "'{\"result\": ...}' records the outcome checked by hand)")
