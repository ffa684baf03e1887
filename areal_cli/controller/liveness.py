"""Progress deadlines: a process that holds work and does not advance is stuck, heartbeat or not.

Heartbeats come from a thread, so they prove only that the process exists. Each heartbeat also
carries ``progress``, a counter its main loop advances (a finished sequence, a new phase of a
step), and ``busy``, the work it holds (the trainer's is known here: a batch sent and its step
not done). A peer that is busy and whose counter has not moved for ``deadline_s`` is stalled.
The clock starts when a peer becomes busy, so a long idle spell is never counted against it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class _Peer:
    progress: int | None = None
    busy: bool = False
    since: float = 0.0  # when progress last moved or the peer last became busy


@dataclass
class ProgressWatch:
    deadline_s: float
    """Seconds a busy peer may go without progress; 0 = never stalled."""
    peers: dict[str, _Peer] = field(default_factory=dict)

    def update(self, peer: str, now: float, progress: int | None = None, busy: bool | None = None) -> None:
        """A report from (or about) ``peer``: its counter and/or whether it holds work."""
        p = self.peers.setdefault(peer, _Peer(since=now))
        moved = progress is not None and progress != p.progress
        started = bool(busy) and not p.busy
        if progress is not None:
            p.progress = progress
        if busy is not None:
            p.busy = busy
        if moved or started:
            p.since = now

    def touch(self, peer: str, now: float) -> None:
        """A message that is progress by itself (a step done, weights loaded)."""
        self.peers.setdefault(peer, _Peer()).since = now

    def stalled(self, now: float) -> list[tuple[str, float]]:
        """(peer, seconds without progress) of every busy peer past the deadline."""
        if self.deadline_s <= 0:
            return []
        return [(name, now - p.since) for name, p in sorted(self.peers.items())
                if p.busy and now - p.since > self.deadline_s]
