"""The public surface changes only on purpose."""

from __future__ import annotations

import subprocess
import sys

import interlock

PUBLIC = {
    "END", "START", "Context", "Decision", "Diagnostic", "ExpressionError", "Goto",
    "InterlockError", "Location", "NoRouteError", "NodeError", "RouteError", "RunError",
    "RunResult", "UsageError", "Verification", "Workflow", "WorkflowError", "WorkflowSpec",
    "WriteConflictError", "__version__", "approve", "cancel", "fork", "goto", "list_runs", "load",
    "modify", "reject", "resume", "send", "status", "trace", "verify",
    # the errors users catch, all in one hierarchy (the house issue)
    "AgentError", "BudgetExceededError", "ClaimError", "ConflictError", "InternalError",
    "RunExists", "RunNotFound", "StepLimitError", "StoreError",
    # issue 26: a broken log (not a usage mistake), a sub-workflow's failure, a shutdown,
    # a run that moved to another owner while this process executed it
    "LogError", "ChildRunError", "Draining", "ClaimLost",
    # the support surface for embedders (a server, a worker): a long-lived store handle
    "Store", "open_store", "make_run_id",
    # what the stored runs of a workflow covered of its declared edges (SPEC §10)
    "Coverage", "coverage",
}


def test_errors_have_the_builtin_bases_users_expect() -> None:
    assert issubclass(interlock.RunNotFound, LookupError)
    assert issubclass(interlock.UsageError, ValueError)
    for name in ("BudgetExceededError", "StepLimitError", "NodeError"):
        assert issubclass(getattr(interlock, name), interlock.RunError), name
    for name in ("StoreError", "AgentError", "RunError", "UsageError", "WorkflowError"):
        assert issubclass(getattr(interlock, name), interlock.InterlockError), name
    from interlock.agents import ProviderError

    assert issubclass(ProviderError, interlock.AgentError)


def test_open_store_is_an_async_context_manager(tmp_path: object) -> None:
    import asyncio

    async def main() -> list[str]:
        async with interlock.open_store(f"sqlite:///{tmp_path}/runs.db") as store:
            wf = interlock.Workflow("handle").node("a", lambda s: {"a": 1})
            wf.edge(interlock.START, "a")
            done = await wf.run(store=store, run_id=interlock.make_run_id())
            return [r.run_id for r in await store.list_runs()] + [done.run_id]

    first, second = asyncio.run(main())
    assert first == second


def test_public_names_are_pinned() -> None:
    assert set(interlock.__all__) == PUBLIC


def test_every_public_name_resolves() -> None:
    for name in interlock.__all__:
        assert getattr(interlock, name) is not None
    from interlock import Workflow, load

    assert Workflow is interlock.Workflow and load is interlock.load


def test_import_does_not_load_the_engine() -> None:
    code = ("import sys, interlock; "
            "print(any(m.startswith(('pydantic', 'interlock._')) for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"
