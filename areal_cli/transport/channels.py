"""ZeroMQ channels: one small class per socket role, each with a bounded wait.

Who binds: the controller binds every socket (it starts first and outlives the others);
rollout workers and trainer rank 0 connect. Every socket is authenticated and encrypted with
the run's CURVE keys (``auth.py``); each channel accepts only its message types (``CHANNELS``).
Every receive takes a timeout and returns None when it expires, so the caller decides what a
silent peer means — never a silent hang.
Sends use a send timeout: a peer that is gone raises ``PeerGone`` naming the channel.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import socket
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import zmq

from areal_cli.durable import atomic_write
from areal_cli.private import read_private
from areal_cli.rundir import RunDir
from areal_cli.transport.auth import Gatekeeper, Keys, curve_client, curve_server
from areal_cli.transport.messages import CHANNELS, BadFrame, decode, encode


class PeerGone(RuntimeError):
    """A send could not complete within its timeout: the receiving side is gone or stuck."""


@dataclass
class Endpoints:
    """Addresses of a run, in ``<run_dir>/endpoints.json``. One process of a run writes the file
    (``publish``): the controller, once its sockets are bound (local runs), or the Slurm job's
    prepare step on node 0 before any process starts; everyone else reads it (``load``)."""

    work: str  # controller PUSH → rollout PULL (CHANNELS["work"])
    results: str  # rollout PUSH → controller PULL (CHANNELS["results"])
    batches: str  # controller PUSH → trainer rank 0 PULL (CHANNELS["batches"])
    control: str  # controller PUB → rollout SUB (CHANNELS["control"])
    status: str  # every process DEALER → controller ROUTER (CHANNELS["status"])
    weights_host: str  # the weight broadcast group's host (trainer rank 0): gloo listens there
    weights_port: int  # its TCPStore's port, where weights_store is empty (Slurm)
    weights_store: str = ""  # the group's FileStore inside the 0700 run directory (local runs)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def load(cls, run_dir: str | Path) -> Endpoints:
        return cls(**json.loads(read_private(RunDir(run_dir).endpoints)))

    def publish(self, run_dir: str | Path) -> None:
        """Write ``endpoints.json`` atomically (the only code that writes it)."""
        atomic_write(RunDir(run_dir).endpoints, json.dumps(self.to_dict(), indent=1))


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


def is_loopback(host: str) -> bool:
    """Whether ``host`` resolves to a loopback address (the run stays on this machine)."""
    try:
        return ipaddress.ip_address(socket.getaddrinfo(host, None)[0][4][0]).is_loopback
    except (OSError, ValueError):
        return False


def check_ports(host: str, ports: list[int]) -> None:
    """Raise OSError naming the first port that cannot be bound on ``host``."""
    for port in ports:
        s = socket.socket()
        try:
            s.bind((host, port))
        except OSError as err:
            raise OSError(f"port {port} on {host} is in use ({err.strerror}): set "
                          "launcher.port_base to a free range, or launcher.port_base=0 to let the "
                          "OS choose") from None
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


def max_frame_bytes(cfg) -> int:
    """The largest frame any socket of the run accepts (``ZMQ_MAXMSGSIZE``): launcher.max_frame_mb,
    or when 0 the largest legitimate frame, a Batch, bounded generously: batch_size × group_size
    samples of an 8192-token prompt plus max_new_tokens × max_turns, 64 bytes a token (ids,
    logprob, version, mask and text), and never under 16 MiB."""
    if cfg.launcher.max_frame_mb:
        return int(cfg.launcher.max_frame_mb) << 20
    tokens = 8192 + cfg.rollout.max_new_tokens * max(1, cfg.workflow.max_turns)
    return max(16 << 20, cfg.trainer.batch_size * cfg.rollout.group_size * tokens * 64 + (1 << 20))


class Channel:
    """One ZeroMQ socket of a channel in ``CHANNELS``: ``bind`` for the controller's side (a
    CURVE server), connect otherwise (a CURVE client with the run's keys).

    hwm bounds the messages queued per peer; linger 0 so close never blocks on a dead peer.
    ``max_frame`` is ``ZMQ_MAXMSGSIZE``: a peer that sends a larger frame is disconnected
    before the frame is read, and ``send`` refuses to send one (naming the setting). A frame
    that is not a well-formed message of this channel's types is counted in ``dropped``,
    logged with its peer and skipped: never fatal to the receiver.
    """

    parts = 1  # frames per message as received (a ROUTER prepends the sender's identity)

    def __init__(self, kind: int, addr: str, bind: bool, name: str, keys: Keys, max_frame: int,
                 hwm: int = 1000, send_timeout_s: float = 60.0, identity: str | None = None,
                 gate: Gatekeeper | None = None):
        self.name, self.addr, self.max_frame = name, addr, max_frame
        self.allowed = CHANNELS[name]
        self.dropped = 0
        self.log = logging.getLogger(f"areal.{name}")
        self.sock = zmq.Context.instance().socket(kind)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, hwm)
        self.sock.setsockopt(zmq.RCVHWM, hwm)
        self.sock.setsockopt(zmq.SNDTIMEO, int(send_timeout_s * 1000))
        self.sock.setsockopt(zmq.MAXMSGSIZE, max_frame)
        if identity:
            self.sock.setsockopt(zmq.IDENTITY, identity.encode())
        if kind == zmq.SUB:
            self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        if bind:
            if gate is None:
                raise ValueError(f"{name}: a socket that binds needs the Gatekeeper (the ZAP "
                                 "handler)")
            curve_server(self.sock, keys)
            gate.watch(self.sock, name)
            self._bind(addr)
        else:
            curve_client(self.sock, keys)
            self.sock.connect(addr)

    def _bind(self, addr: str) -> None:
        if addr.endswith(":0"):  # let the OS pick: no race with other processes
            port = self.sock.bind_to_random_port(addr.rsplit(":", 1)[0])
            self.addr = f"{addr.rsplit(':', 1)[0]}:{port}"
            return
        try:
            self.sock.bind(addr)
        except zmq.ZMQError as err:
            raise OSError(f"cannot bind {self.name} channel to {addr}: {err} (is the port in use? "
                          "set launcher.host or free the port)") from None

    def _frame(self, msg) -> bytes:
        if not isinstance(msg, self.allowed):
            raise TypeError(f"the {self.name} channel carries {self.allowed}, not "
                            f"{type(msg).__name__}")
        frame = encode(msg)
        if len(frame) > self.max_frame:
            raise ValueError(f"{self.name}: a {type(msg).__name__} of {len(frame) >> 20} MiB "
                             f"exceeds the {self.max_frame >> 20} MiB frame limit; raise "
                             "launcher.max_frame_mb")
        return frame

    def send(self, msg) -> None:
        try:
            self.sock.send(self._frame(msg))
        except zmq.Again:
            raise PeerGone(f"{self.name}: no receiver took the message within the send timeout "
                           f"({self.addr})") from None

    def try_send(self, msg) -> bool:
        """Send without waiting; False when every peer's queue is full (or none is connected)."""
        try:
            self.sock.send(self._frame(msg), zmq.NOBLOCK)
            return True
        except zmq.Again:
            return False

    def recv(self, timeout_s: float):
        """The next well-formed message, or None after ``timeout_s`` seconds (bad frames
        skipped)."""
        deadline = time.monotonic() + timeout_s
        while self.sock.poll(max(0, int((deadline - time.monotonic()) * 1000))):
            parts = self.sock.recv_multipart(copy=False)
            msg = self._accept(parts)
            if msg is not None:
                return msg
        return None

    def _accept(self, parts: list):
        """The message in ``parts`` (one frame; a ROUTER adds the sender's identity), or None
        after counting and logging a frame that is not one of this channel's messages."""
        peer = _peer(parts[-1])
        if self.parts == 2 and len(parts) == 2:
            peer = f"{bytes(parts[0]).decode('utf-8', 'replace')!r} at {peer}"
        try:
            if len(parts) != self.parts:
                raise BadFrame(f"{len(parts)} frames in one message")
            return decode(parts[-1].bytes, self.allowed)
        except BadFrame as err:
            self.dropped += 1
            if self.dropped <= 10 or self.dropped % 100 == 0:
                self.log.warning("%s channel: dropped frame %d from %s: %s", self.name,
                                 self.dropped, peer, err)
            return None

    def close(self, linger_s: float = 0.0) -> None:
        """Close; with ``linger_s``, what is still queued goes out for that long (see
        ``shutdown``)."""
        self.sock.close(int(linger_s * 1000))


def shutdown(timeout_s: float = 2.0) -> None:
    """End ZeroMQ in this process once every socket is closed: waits (at most ``timeout_s``)
    until the sockets closed with a linger have sent what they queued. A process that exits
    right after a send loses the message about half the time (seen with PUB "stop")."""
    t = threading.Thread(target=zmq.Context.instance().term, daemon=True, name="zmq-shutdown")
    t.start()
    t.join(timeout_s)


def _peer(frame) -> str:
    try:
        return frame.get("Peer-Address")
    except zmq.ZMQError:
        return "an unknown peer"


class Router(Channel):
    """The controller's status socket: receives the status messages (``SENDERS``) from every
    DEALER."""

    parts = 2

    def __init__(self, addr: str, keys: Keys, max_frame: int, gate: Gatekeeper):
        super().__init__(zmq.ROUTER, addr, bind=True, name="status", keys=keys, max_frame=max_frame,
                         gate=gate)


def status_sender(addr: str, name: str, keys: Keys, max_frame: int) -> Channel:
    return Channel(zmq.DEALER, addr, bind=False, name="status", keys=keys, max_frame=max_frame,
                   identity=name, send_timeout_s=30.0)


class ReplyRouter(Channel):
    """The reward-model process's socket (it binds; a CURVE server with its own Gatekeeper): every
    rollout worker's DEALER sends ``RewardRequest``s, each answered with one ``RewardReply`` to the
    worker that asked. A worker gone before its reply is dropped by ZeroMQ (ROUTER_MANDATORY off);
    replies never block (hwm 10000, send timeout 0 s)."""

    parts = 2

    def __init__(self, addr: str, keys: Keys, max_frame: int, gate: Gatekeeper):
        super().__init__(zmq.ROUTER, addr, bind=True, name="reward", keys=keys, max_frame=max_frame,
                         gate=gate, hwm=10000, send_timeout_s=0.0)

    def recv_from(self, timeout_s: float):
        """(sender identity, message) of the next well-formed request, or None after
        ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while self.sock.poll(max(0, int((deadline - time.monotonic()) * 1000))):
            parts = self.sock.recv_multipart(copy=False)
            msg = self._accept(parts)
            if msg is not None:
                return bytes(parts[0]), msg
        return None

    def reply(self, identity: bytes, msg) -> None:
        try:
            self.sock.send_multipart([identity, self._frame(msg)], zmq.NOBLOCK)
        except zmq.Again:
            self.log.warning("reward channel: the reply to %r was dropped (its queue is full)",
                             identity)


def reward_client(addr: str, name: str, keys: Keys, max_frame: int) -> Channel:
    """A rollout worker's DEALER to the reward-model process (identity = the worker's name)."""
    return Channel(zmq.DEALER, addr, bind=False, name="reward", keys=keys, max_frame=max_frame,
                   identity=name, hwm=10000, send_timeout_s=5.0)
