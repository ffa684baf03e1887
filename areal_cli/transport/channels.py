"""ZeroMQ channels: one small class per socket role, each with a bounded wait.

Who binds: the controller binds every socket (it starts first and outlives the others);
rollout workers and trainer rank 0 connect. Every receive takes a timeout and returns None
when it expires, so the caller decides what a silent peer means — never a silent hang.
Sends use a send timeout: a peer that is gone raises ``PeerGone`` naming the channel.
"""

from __future__ import annotations

import socket
from dataclasses import asdict, dataclass

import zmq

from areal_cli.transport.messages import decode, encode


class PeerGone(RuntimeError):
    """A send could not complete within its timeout: the receiving side is gone or stuck."""


@dataclass
class Endpoints:
    """Addresses of a run, chosen by the launcher and written to ``<run_dir>/endpoints.json``."""

    work: str  # controller PUSH → rollout PULL: WorkItem
    results: str  # rollout PUSH → controller PULL: GroupResult
    batches: str  # controller PUSH → trainer rank 0 PULL: Batch
    control: str  # controller PUB → rollout SUB: Control
    status: str  # every process DEALER → controller ROUTER: Status
    weights_host: str  # TCPStore of the weight broadcast group (hosted by trainer rank 0)
    weights_port: int

    def to_dict(self) -> dict:
        return asdict(self)


def free_ports(host: str, n: int) -> list[int]:
    """``n`` distinct ports that are free right now on ``host`` (the OS picks them)."""
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind((host, 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def check_ports(host: str, ports: list[int]) -> None:
    """Raise OSError naming the first port that cannot be bound on ``host``."""
    for port in ports:
        s = socket.socket()
        try:
            s.bind((host, port))
        except OSError as err:
            raise OSError(f"port {port} on {host} is in use ({err.strerror}): set launcher.port_base to "
                          "a free range, or launcher.port_base=0 to let the OS choose") from None
        finally:
            s.close()


def make_endpoints(host: str, port_base: int = 0) -> Endpoints:
    if port_base:
        p = list(range(port_base, port_base + 6))
        check_ports(host, p)
    else:
        p = free_ports(host, 6)
    tcp = [f"tcp://{host}:{x}" for x in p[:5]]
    return Endpoints(*tcp, weights_host=host, weights_port=p[5])


class Channel:
    """One ZeroMQ socket. ``bind`` for the controller's side, connect otherwise.

    hwm bounds the messages queued per peer; linger 0 so close never blocks on a dead peer.
    """

    def __init__(self, kind: int, addr: str, bind: bool, name: str, hwm: int = 1000,
                 send_timeout_s: float = 60.0, identity: str | None = None):
        self.name, self.addr = name, addr
        self.sock = zmq.Context.instance().socket(kind)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, hwm)
        self.sock.setsockopt(zmq.RCVHWM, hwm)
        self.sock.setsockopt(zmq.SNDTIMEO, int(send_timeout_s * 1000))
        if identity:
            self.sock.setsockopt(zmq.IDENTITY, identity.encode())
        if kind == zmq.SUB:
            self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        if bind and addr.endswith(":0"):  # let the OS pick: no race with other processes
            port = self.sock.bind_to_random_port(addr.rsplit(":", 1)[0])
            self.addr = f"{addr.rsplit(':', 1)[0]}:{port}"
        elif bind:
            try:
                self.sock.bind(addr)
            except zmq.ZMQError as err:
                raise OSError(f"cannot bind {name} channel to {addr}: {err} (is the port in use? "
                              "set launcher.host or free the port)") from None
        else:
            self.sock.connect(addr)

    def send(self, msg) -> None:
        try:
            self.sock.send(encode(msg))
        except zmq.Again:
            raise PeerGone(f"{self.name}: no receiver took the message within the send timeout "
                           f"({self.addr})") from None

    def try_send(self, msg) -> bool:
        """Send without waiting; False when every peer's queue is full (or none is connected)."""
        try:
            self.sock.send(encode(msg), zmq.NOBLOCK)
            return True
        except zmq.Again:
            return False

    def recv(self, timeout_s: float):
        """The next message, or None after ``timeout_s`` seconds."""
        if not self.sock.poll(int(timeout_s * 1000)):
            return None
        return decode(self.sock.recv())

    def close(self) -> None:
        self.sock.close(0)


class Router(Channel):
    """The controller's status socket: receives ``Status`` from every DEALER."""

    def __init__(self, addr: str):
        super().__init__(zmq.ROUTER, addr, bind=True, name="status")

    def recv(self, timeout_s: float):
        if not self.sock.poll(int(timeout_s * 1000)):
            return None
        _ident, frame = self.sock.recv_multipart()
        return decode(frame)


def status_sender(addr: str, name: str) -> Channel:
    return Channel(zmq.DEALER, addr, bind=False, name="status", identity=name, send_timeout_s=30.0)
