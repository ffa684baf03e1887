"""Who may talk on a run's ZeroMQ sockets: per-run CURVE keys and the controller's gatekeeper.

The launcher writes two key pairs into ``<run_dir>/keys/`` (the directory 0700, every file
0600): the server pair (every socket the controller binds is a CURVE server) and the client
pair (every process that connects). A ZAP handler in the controller admits only the run's
client public key; a peer without the keys cannot finish the handshake, so it can neither
send a frame nor receive one (a stranger's PULL socket gets nothing). Traffic is encrypted
and authenticated per connection. Every refused connection is counted; it is logged at most once
a minute per source, with the running count: ZAP refusals per peer address, failed handshakes
(no keys, not CURVE at all, or idle past ``HANDSHAKE_S``) per channel and the port it is bound to
(ZeroMQ does not tell a failed handshake's peer address). A connection that has not finished
its handshake within ``HANDSHAKE_S`` is dropped, so a flood of idle connections holds few
descriptors. Anyone who can read ``keys/`` — the run's user, and root — is trusted.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils.monitor import recv_monitor_message

from areal_cli.private import read_private
from areal_cli.rundir import RunDir


@dataclass(frozen=True)
class Keys:
    """The run's CURVE keys (z85 bytes)."""

    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes


def make_keys(run_dir: str | Path) -> Path:
    """Fresh key pairs in ``<run_dir>/keys`` (replacing older ones); returns the directory."""
    if not zmq.has("curve"):
        raise ValueError("this libzmq has no CURVE support, which areal needs to authenticate its "
                         "sockets: install pyzmq from its wheels (pip install --force-reinstall "
                         "pyzmq)")
    path = RunDir(run_dir).keys
    if path.is_symlink() or path.exists():
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    path.mkdir(mode=0o700, parents=True)
    # mkdir's mode is masked by the umask; the files below are never reachable by others
    path.chmod(0o700)
    for name in ("server", "client"):
        for f in zmq.auth.create_certificates(path, name):
            os.chmod(f, 0o600)
    return path


def load_keys(run_dir: str | Path) -> Keys:
    """The keys of the run in ``run_dir``; ValueError naming the fix when missing or readable by
    others."""
    path = RunDir(run_dir).keys
    if not (path / "client.key_secret").is_file():
        raise ValueError(f"no ZeroMQ keys in {path}: start runs with `areal train` "
                         "(it writes them)")
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ValueError(f"{path} is accessible to other users (mode {stat.filemode(mode)}): "
                         f"chmod -R go-rwx {path}")
    server_public, server_secret = _certificate(path / "server.key_secret")
    client_public, client_secret = _certificate(path / "client.key_secret")
    return Keys(server_public, server_secret, client_public, client_secret)


def _certificate(path: Path) -> tuple[bytes, bytes]:
    """The public and secret key of a ZeroMQ certificate file (``zmq.auth``'s format), read without
    following a link and only when the running user owns it (``read_private``)."""
    found = {}
    for line in read_private(path).splitlines():
        key, eq, value = line.strip().partition(b"=")
        if eq and key.strip() in (b"public-key", b"secret-key"):
            found[key.strip()] = value.strip(b" \t'\"")
    if len(found) != 2:
        raise ValueError(f"{path} is not a ZeroMQ secret certificate: start runs with `areal "
                         "train` (it writes them)")
    return found[b"public-key"], found[b"secret-key"]


def curve_server(sock: zmq.Socket, keys: Keys) -> None:
    sock.curve_secretkey = keys.server_secret
    sock.curve_publickey = keys.server_public
    sock.zap_domain = b"areal"
    sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)  # no ZAP handler running: refuse, never admit
    sock.curve_server = True


def curve_client(sock: zmq.Socket, keys: Keys) -> None:
    sock.curve_secretkey = keys.client_secret
    sock.curve_publickey = keys.client_public
    sock.curve_serverkey = keys.server_public


_FAILED = {zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "handshake failed",
           zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "not a CURVE peer with the run's server key"}

HANDSHAKE_S = 2.0
"""A server socket drops a connection whose handshake has not finished by then
(``ZMQ_HANDSHAKE_IVL``; ZeroMQ's default, 30 s, let idle connections hold thousands of descriptors).
A run's own peers finish on loopback in milliseconds, and reconnect on their own if ever dropped."""

LOG_EVERY_S = 60.0
"""At most one log line per source of refused connections (a peer address, or a channel) per this
many seconds; each line carries the running count."""

MAX_SOURCES = 1024
"""Sources counted one by one; refusals from further sources are counted under "other sources"."""


class Gatekeeper:
    """The controller's ZAP handler (admits only the run's client key) and a watcher of its
    server sockets' handshakes. ``refused`` counts every refused connection."""

    def __init__(self, keys: Keys, log: logging.Logger, context: zmq.Context | None = None):
        self.log, self.refused = log, 0
        self.context = context or zmq.Context.instance()
        self._lock = threading.Lock()
        self._monitors: list[tuple[str, zmq.Socket]] = []
        self._counts: dict[str, int] = {}  # refusals per source
        self._logged: dict[str, float] = {}  # when each source was last logged (monotonic)
        self._stopped = threading.Event()
        self.auth = _Authenticator(self, keys.client_public)
        for attempt in range(100):  # a handler stopped just before may still hold the ZAP address
            try:
                self.auth.start()
                break
            except zmq.ZMQError as err:
                if err.errno != zmq.EADDRINUSE or attempt == 99:
                    raise
                time.sleep(0.05)
        self.auth.configure_curve_callback(domain="areal", credentials_provider=self.auth)
        threading.Thread(target=self._watch, daemon=True, name="zmq-handshakes").start()

    def watch(self, sock: zmq.Socket, name: str) -> None:
        """Count and log failed handshakes on the server socket ``sock`` of channel ``name``, and
        drop connections that have not finished theirs within ``HANDSHAKE_S``."""
        sock.setsockopt(zmq.HANDSHAKE_IVL, int(HANDSHAKE_S * 1000))
        with self._lock:
            self._monitors.append((name, sock.get_monitor_socket(
                zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)))

    def _refuse(self, source: str, what: str) -> None:
        """Count one refused connection from ``source``; log it unless that source was logged
        within ``LOG_EVERY_S``."""
        now = time.monotonic()
        with self._lock:
            self.refused += 1
            if source not in self._counts and len(self._counts) >= MAX_SOURCES:
                source = "other sources"
            count = self._counts[source] = self._counts.get(source, 0) + 1
            if now - self._logged.get(source, -LOG_EVERY_S) < LOG_EVERY_S:
                return
            self._logged[source] = now
        self.log.warning("refused a connection: %s (%d so far from there; at most one line a "
                         "minute each)",
                         what, count)

    def _watch(self) -> None:
        poller, names = zmq.Poller(), {}
        while not self._stopped.is_set():
            with self._lock:
                for name, mon in self._monitors[len(names):]:
                    poller.register(mon, zmq.POLLIN)
                    names[mon] = name
            try:
                for mon, _ in poller.poll(200):
                    event = recv_monitor_message(mon)
                    source = f"{names[mon]} channel ({event['endpoint'].decode(errors='replace')})"
                    why = ("no handshake within the time allowed" if event["value"] == errno.EAGAIN
                           else _FAILED.get(event["event"], "handshake failed"))
                    self._refuse(source, f"{source}: {why}")
            except zmq.ZMQError:  # the context is closing
                return
        for mon in names:
            mon.close(0)

    def stop(self) -> None:
        self._stopped.set()
        self.auth.stop()


class _Authenticator(ThreadAuthenticator):
    """ZAP over CURVE: the run's client key passes; anything else is refused and logged with
    the peer's address (the ZAP request carries it; the key callback does not)."""

    def __init__(self, gate: Gatekeeper, client_public: bytes):
        super().__init__(gate.context, log=logging.getLogger("areal.zap"))
        self.gate, self.client_public, self._peer = gate, client_public, "?"

    async def handle_zap_message(self, msg: list[bytes]) -> None:
        self._peer = msg[3].decode("utf-8", "replace") if len(msg) > 3 else "?"
        await super().handle_zap_message(msg)

    def callback(self, domain: str, key: bytes) -> bool:
        if key == self.client_public:
            return True
        self.gate._refuse(f"peer {self._peer}",
                          f"peer {self._peer} presented a CURVE key that is not this run's")
        return False
