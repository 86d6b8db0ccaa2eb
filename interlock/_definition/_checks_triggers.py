"""The checks of ``triggers:``: cron expressions, poll functions, the input a trigger
gives, trigger ids that differ."""

from __future__ import annotations

from ._checking import CheckContext


def check_triggers(checker: CheckContext) -> None:
    """``triggers:``: a cron that parses, a poll function that imports, the input the
    workflow declares, ids that differ (they make the runs' ids)."""
    if not checker.spec.triggers:
        return
    from .._worker._triggers import check_schedule, trigger_id

    seen: dict[str, int] = {}
    for i, t in enumerate(checker.spec.triggers):
        if t.schedule is not None:
            problem = check_schedule(t.schedule)
            if problem is not None:
                checker.add("error", f"trigger {i + 1}: schedule {t.schedule!r} is not a cron "
                            f"expression: {problem} (five fields: minute hour day month "
                            "weekday, in UTC; or six with seconds first)",
                            ("triggers", i, "schedule"), "trigger")
        if t.poll is not None:
            checker.resolve(t.poll, ("triggers", i, "poll"), f"trigger {i + 1}")
        else:
            missing = [n for n in checker.spec.input if n not in (t.input or {})]
            if missing:
                checker.add("error", f"trigger {i + 1}: the workflow declares input "
                            f"{missing}, which this trigger's input: does not give; its runs "
                            "would be refused (add them, e.g. input: {"
                            + ", ".join(f"{n}: ..." for n in missing) + "})",
                            ("triggers", i, "input") if t.input is not None
                            else ("triggers", i), "trigger")
        tid = trigger_id(t)
        if tid in seen:
            checker.add("error", f"trigger {i + 1} has the same id as trigger {seen[tid] + 1} "
                        f"({tid!r}): their runs' ids would collide; give one an id: of its "
                        "own", ("triggers", i), "trigger")
        seen.setdefault(tid, i)
