"""``interlock serve``'s listening socket says it is TCP, so that asyncio sets
TCP_NODELAY on each connection it accepts: with protocol 0 it did not, and on a
kept-alive connection each small answer (``/api/health``, a run object, an SSE event)
waited for the client's delayed ACK -- about 40 ms -- before its body was sent (Nagle).
The option is read from the accepted socket: no timing involved."""

from __future__ import annotations

import asyncio
import socket

from interlock.server._main import _listen


def test_a_connection_to_the_server_is_accepted_with_tcp_nodelay() -> None:
    async def main() -> int:
        sock = _listen("127.0.0.1", 0)
        accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                s = transport.get_extra_info("socket")
                accepted.set_result(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        server = await asyncio.get_running_loop().create_server(Probe, sock=sock)
        try:
            port = sock.getsockname()[1]
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            nodelay = await asyncio.wait_for(accepted, 30)
            writer.close()
            return nodelay
        finally:
            server.close()
            await server.wait_closed()

    assert asyncio.run(main()) != 0
