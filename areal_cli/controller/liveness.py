"""Progress deadlines: a process that holds work and does not advance is stuck, heartbeat or not.

Heartbeats come from a thread, so they prove only that the process exists. Each heartbeat also
carries ``progress``, a counter its main loop advances (a finished sequence, a new phase of a
step), and ``busy``, the work it holds (the trainer's is known here: a batch sent and its step
not done). A peer that is busy and whose counter has not moved for ``deadline_s`` is stalled.
The clock starts when a peer becomes busy, so a long idle spell is never counted against it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from areal_cli.transport.messages import Phase

_OTHER = (Phase.other, -1)


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

    def update(self, peer: str, now: float, progress: int | None = None,
               busy: bool | None = None) -> None:
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


def culprits(stalled: list[tuple[str, float]], watch: ProgressWatch,
             phase: dict[str, tuple[Phase, int]],
             loaded: dict[str, int], peers: set[str], version: int, now: float) -> list[tuple[str,
                                                                                              float,
                                                                                              str]]:
    """(peer, idle seconds, why) of the processes to name for ``stalled``. ``phase`` is each peer's
    last (``Heartbeat.phase``, ``Heartbeat.version``); a peer not in it does something else. A
    trainer stuck in phase sending_weights waits in a collective for the rollout workers that have
    neither loaded the weights of ``version`` nor begun to receive them (phase receiving_weights of
    ``version``): those are named instead of it."""
    out = [(peer, idle, "") for peer, idle in stalled]
    if "trainer-0" not in dict(stalled) or phase.get("trainer-0",
                                                     _OTHER)[0] != Phase.sending_weights:
        return out
    waited = not_joined(peers - {"trainer-0"}, phase, loaded, version)
    if not waited:
        return out
    note = f"; trainer-0 waits for it to join the weight update of version {version}"
    named = {peer for peer, _, _ in out}
    out = [o for o in out if o[0] != "trainer-0"]
    out += [(r, now - watch.peers[r].since if r in watch.peers else 0.0, note) for r in waited
            if r not in named]
    return sorted(out)


def not_joined(workers, phase: dict[str, tuple[Phase, int]], loaded: dict[str, int],
               version: int) -> list[str]:
    """The rollout workers, sorted, that have neither loaded the weights of ``version`` nor begun to
    receive them (their last heartbeat's phase)."""
    joined = (Phase.receiving_weights, version)
    return sorted(r for r in workers if loaded.get(r, -1) < version and phase.get(r) != joined)
