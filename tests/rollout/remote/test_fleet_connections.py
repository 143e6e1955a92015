"""The fleet's HTTP client and the connections it closes itself.

httpcore's pool closes idle connections once it holds more than its keep-alive cap in all, and
a connection it has just handed to a request that has not started yet counts as idle: closed
under that request, it failed as a transport error and marked a healthy server dead. The
fleet's client has no such cap; idle connections still expire after `KEEPALIVE_S`. Checked
through the real httpx / httpcore pool against a local keep-alive server that counts the
connections its clients close. The pool's keep-alive expiry can still close a connection it
has just handed out: a request whose connection the client closed is sent again
(`Fleet.send`), and `closed_by_client` tells that from a server's reset, each checked against
the real httpx / anyio errors."""

from __future__ import annotations

import asyncio
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import anyio
import httpx
import pytest

from frlab.rollout.remote import fleet as fleet_module
from frlab.rollout.remote.fleet import REOPENS, Fleet, ServerFault, closed_by_client

IN_FLIGHT = 80  # more requests at once than the old cap of 64 idle connections


class LocalServer(ThreadingHTTPServer):
    """An HTTP/1.1 keep-alive server on a free loopback port; `closed` counts the connections
    that ended, `barrier` holds IN_FLIGHT requests until all of them are in."""

    daemon_threads = True
    request_queue_size = 256

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self.closed = 0
        self.barrier = threading.Barrier(IN_FLIGHT, timeout=30)
        self.lock = threading.Lock()

    def shutdown_request(self, request: object) -> None:
        with self.lock:
            self.closed += 1
        super().shutdown_request(request)

    def handle_error(self, request: object, client_address: object) -> None:
        if not isinstance(sys.exc_info()[1], BrokenPipeError):  # an answer to a closed client
            super().handle_error(request, client_address)


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[LocalServer]:
    srv = LocalServer(handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


class Quiet(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: LocalServer

    def answer(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class AllAtOnce(Quiet):
    """Each round of requests is answered only once IN_FLIGHT of them are in, so the client
    holds IN_FLIGHT connections at once."""

    def do_POST(self) -> None:  # noqa: N802  (http.server's name)
        self.rfile.read(int(self.headers["content-length"]))
        self.server.barrier.wait()
        self.answer(b'{"ok": true}')


@pytest.mark.slow
def test_no_connection_is_closed_while_more_requests_are_in_flight_than_the_old_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fleet_module, "KEEPALIVE_S", 60.0)  # no expiry within the test

    async def rounds(server: LocalServer) -> list[int]:
        fleet = Fleet([server.url], 30.0, 1.0, 30.0)
        fleet.open()
        closed = []
        try:
            for _ in range(3):
                answers = await asyncio.gather(
                    *(fleet.post(fleet.servers[0], "/x", {"i": i}) for i in range(IN_FLIGHT))
                )
                assert answers == [{"ok": True}] * IN_FLIGHT
                await asyncio.sleep(0.2)  # a connection the client closed: seen by now
                closed.append(server.closed)
        finally:
            await fleet.close()
        return closed

    with serving(AllAtOnce) as server:
        assert asyncio.run(rounds(server)) == [0, 0, 0]


class SlowOrResetting(Quiet):
    """`/slow` answers after 1 s; `/reset` resets the connection (RST) while the client waits."""

    def do_POST(self) -> None:  # noqa: N802  (http.server's name)
        self.rfile.read(int(self.headers["content-length"]))
        if self.path == "/reset":
            time.sleep(0.3)
            linger = struct.pack("ii", 1, 0)  # close now, with a reset instead of a FIN
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
            self.connection.close()
            self.close_connection = True
            return
        time.sleep(1.0)
        self.answer(b"{}")


def test_closed_by_client_tells_the_clients_own_close_from_a_servers_reset() -> None:
    """Both reach httpx as `ReadError('')` (as in the fleet's log); only the client's own
    close of its connection under a request is `closed_by_client`."""

    async def errors(url: str) -> tuple[BaseException, BaseException]:
        client = httpx.AsyncClient()
        request = asyncio.create_task(client.post(url + "/slow", json={}))
        await asyncio.sleep(0.3)
        await client.aclose()  # the pool closes the connection the request waits on
        with pytest.raises(httpx.ReadError) as ours:
            await request
        async with httpx.AsyncClient() as client:
            with pytest.raises(httpx.ReadError) as theirs:
                await client.post(url + "/reset", json={})
        return ours.value, theirs.value

    with serving(SlowOrResetting) as server:
        ours, theirs = asyncio.run(errors(server.url))
    assert closed_by_client(ours) and not closed_by_client(theirs), (ours, theirs)
    assert not closed_by_client(httpx.ConnectError("refused"))


def closed_under(request: httpx.Request) -> httpx.ReadError:
    """The error httpx raises when its pool closed the connection under `request`."""
    error = httpx.ReadError("", request=request)
    error.__cause__ = anyio.ClosedResourceError()
    return error


def fleet_on(answers: list) -> tuple[Fleet, list]:
    """A fleet of one server whose transport answers from `answers` in turn (an exception
    factory is raised)."""
    calls: list = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        answer = answers[min(len(calls), len(answers)) - 1]
        if callable(answer):
            raise answer(request)
        return httpx.Response(200, json=answer)

    fleet = Fleet(["http://server"], 5.0, 1.0, 5.0)
    fleet.client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return fleet, calls


def test_a_request_whose_connection_the_client_closed_is_sent_again() -> None:
    fleet, calls = fleet_on([closed_under, {"ok": True}])
    assert asyncio.run(fleet.post(fleet.servers[0], "/x", {})) == {"ok": True}
    assert calls == ["/x", "/x"]


def test_a_servers_reset_or_a_client_close_every_time_is_a_fault() -> None:
    def reset(request: httpx.Request) -> httpx.ReadError:
        return httpx.ReadError("", request=request)  # no ClosedResourceError under it

    fleet, calls = fleet_on([reset, {"ok": True}])
    with pytest.raises(ServerFault, match="transport error") as fault:
        asyncio.run(fleet.post(fleet.servers[0], "/x", {}))
    assert fault.value.kind == "dead" and calls == ["/x"]

    fleet, calls = fleet_on([closed_under])
    with pytest.raises(ServerFault, match="transport error"):
        asyncio.run(fleet.post(fleet.servers[0], "/x", {}))
    assert calls == ["/x"] * (REOPENS + 1)
