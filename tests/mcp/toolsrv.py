"""An MCP server of the tests' own (the SDK's MCPServer): stdio by default, streamable
HTTP on ``127.0.0.1:PORT`` when given a port. It appends each call to ``calls.log`` (with
its pid) in ``$TOOLSRV_DIR``; with a ``v2`` file there it no longer offers ``hold``."""

import os
import sys
import time
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

here = Path(os.environ.get("TOOLSRV_DIR", "."))
server = MCPServer("toolsrv")


def log(line: str) -> None:
    with open(here / "calls.log", "a") as f:
        f.write(f"{line} pid={os.getpid()}\n")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    log(f"add {a} {b}")
    return a + b


@server.tool()
def delete(path: str) -> str:
    """Delete a file (destructive: confirmed by a person)."""
    log(f"delete {path}")
    return f"deleted {path}"


@server.tool()
def broken() -> str:
    """Always fails."""
    raise ToolError("the disk is on fire")


if not (here / "v2").exists():

    @server.tool()
    def hold() -> str:
        """Blocks until released."""
        (here / "hold.started").write_text(str(os.getpid()))
        while not (here / "hold.release").exists():
            time.sleep(0.02)
        log("hold")
        return "held"


if __name__ == "__main__":
    if len(sys.argv) > 1:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
    else:
        server.run()
