"""How the agent endpoint is served (serving.py), on real sockets: each connection it accepts has
Nagle's algorithm off (a response written in two parts would otherwise wait for the client's delayed
ACK on every call), and a later endpoint of the process takes the first one's port and token."""

from __future__ import annotations

import socket
import threading

from fastapi import FastAPI

from areal_cli.workflows.agent.serving import Server, new_token


def _app() -> FastAPI:
    app = FastAPI()

    @app.get("/ping")
    async def ping():
        return {"ok": True}

    return app


def test_every_accepted_connection_has_nagle_off():
    from uvicorn.protocols.http.h11_impl import H11Protocol

    seen, made = [], threading.Event()

    class Recording(H11Protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            sock = transport.get_extra_info("socket")
            seen.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            made.set()

    server = Server(_app(), Recording)
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as conn:
            conn.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
            reply = b""
            while not reply.endswith(b'{"ok":true}'):  # headers and body: two writes
                reply += conn.recv(4096) or b"<closed>"
                assert not reply.endswith(b"<closed>")
        assert made.wait(5) and seen == [1]
    finally:
        server.close()


def test_a_later_endpoint_of_the_process_takes_the_first_ones_port_and_token():
    first = Server(_app())
    port = first.port
    first.close()
    second = Server(_app())
    try:
        assert second.port == port == Server.first_port and new_token() == new_token()
    finally:
        second.close()
