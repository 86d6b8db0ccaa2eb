"""``interlock mcp``: the registered workflows as MCP tools over stdio."""

from __future__ import annotations

import click

from ._common import CliError, store_option


@click.command(short_help="Serve workflows as MCP tools over stdio.")
@store_option
@click.option("--workflows", "workflows", multiple=True, metavar="PATH", required=True,
              help="A workflow file, or a folder of *.yaml/*.json (repeatable); each is "
                   "a tool named by its workflow: name.")
@click.option("--public-url", metavar="URL",
              help="Where an `interlock serve` on the same store is reached: a waiting "
                   "run's answer then links its gate in the dashboard.")
def mcp(store_url: str | None, workflows: tuple[str, ...], public_url: str | None) -> None:
    """Serve the workflows as MCP tools on stdin/stdout, for a chat client or an IDE
    (Claude Desktop, an editor's agent): one tool per workflow (a conversation file's
    takes {text, run_id?}), and interlock_run_status. Runs execute in this process, on
    the store -- a task's run (MCP's tasks extension) as long as the process lives;
    stdout carries only the protocol."""
    try:
        from ..mcp import LocalRuns, tools_server
    except ImportError as exc:
        from ..support import install_hint

        raise CliError(f"interlock mcp needs the mcp extra: {install_hint('mcp')} "
                       f"({exc})") from None
    import anyio
    from mcp.server.stdio import stdio_server

    from .. import StoreError, UsageError, open_store
    from ..support import load_workflows

    try:
        registered = load_workflows(list(workflows))
        store = open_store(store_url)
    except (UsageError, StoreError) as exc:
        raise CliError(str(exc)) from None
    runs = LocalRuns(registered, store, public_url)
    server = tools_server(runs)

    async def serve() -> None:
        try:
            async with stdio_server() as (read, write):
                await server.run(read, write, server.create_initialization_options())
        finally:
            await runs.close()  # tasks' runs still executing stop where they are
            await store.close()

    anyio.run(serve)
