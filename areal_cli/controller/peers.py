"""What the controller knows of the run's other processes (its peers), from their status messages:
when each last spoke, what it said it was doing, its phase, the weights it loaded, its progress
(``liveness.ProgressWatch``). ``Peers.check`` ends the run (``PeerStalled``) when one did not start,
went silent for ``launcher.peer_timeout_s``, or held work without progress for
``launcher.progress_timeout_s``, naming it and what it was doing."""

from __future__ import annotations

from dataclasses import dataclass, field

from areal_cli.controller.liveness import ProgressWatch, culprits, not_joined
from areal_cli.transport.messages import Heartbeat, Phase


class PeerStalled(RuntimeError):
    """A peer did not start, went silent or is stuck: the run ends, naming it."""


@dataclass
class Peers:
    names: set[str]
    """Every process that may send a status message: ``rollout-<i>`` and ``trainer-0``."""
    watch: ProgressWatch
    rollouts_up: set[str] = field(default_factory=set)
    """The rollout workers that said hello."""
    last_seen: dict[str, float] = field(default_factory=dict)
    doing: dict[str, str] = field(default_factory=dict)
    """peer → its last words (for people)."""
    phase: dict[str, tuple[Phase, int]] = field(default_factory=dict)
    """peer → its last (phase, version) (for culprits())."""
    loaded: dict[str, int] = field(default_factory=dict)
    """rollout → the weight version it last reported loaded."""

    @classmethod
    def of_run(cls, cfg) -> Peers:
        names = {f"rollout-{i}" for i in range(cfg.rollout.workers)} | {"trainer-0"}
        return cls(names, ProgressWatch(cfg.launcher.progress_timeout_s))

    def heard(self, msg, now: float) -> None:
        """Any legitimate status message from ``msg.sender``."""
        self.last_seen[msg.sender] = now
        if not isinstance(msg, Heartbeat):
            self.watch.touch(msg.sender, now)  # a message that is progress by itself

    def on_heartbeat(self, msg: Heartbeat, now: float) -> None:
        self.doing[msg.sender] = msg.doing or self.doing.get(msg.sender, "")
        self.phase[msg.sender] = (msg.phase, msg.version)
        self.watch.update(msg.sender, now, msg.progress, None if msg.busy < 0 else msg.busy > 0)

    def not_joined(self, version: int) -> list[str]:
        """The rollout workers up that have neither loaded ``version`` nor begun to receive it."""
        return not_joined(self.rollouts_up, self.phase, self.loaded, version)

    def check(self, now: float, start: float, launcher, version: int) -> None:
        """PeerStalled naming each peer that did not start within ``launcher.startup_timeout_s`` of
        ``start``, went silent, or holds work without progress (``version``: the policy's, for
        culprits())."""
        for peer in self.names:
            seen = self.last_seen.get(peer)
            if seen is None and now - start > launcher.startup_timeout_s:
                raise PeerStalled(f"{peer} did not start within launcher.startup_timeout_s="
                                  f"{launcher.startup_timeout_s:.0f}s (see logs/{peer}.log)")
            if seen is not None and now - seen > launcher.peer_timeout_s:
                raise PeerStalled(f"{peer} sent no heartbeat for {now - seen:.0f}s; it was "
                                  f"{self.doing.get(peer) or 'busy'} (see logs/{peer}.log for its "
                                  "stack)")
        stalled = self.watch.stalled(now)
        if stalled:
            raise PeerStalled("; ".join(
                f"{peer} made no progress for {idle:.0f}s while it had work "
                f"(launcher.progress_timeout_s={launcher.progress_timeout_s:g}); it was "
                f"{self.doing.get(peer) or 'busy'}{why} (see logs/{peer}.log for its "
                "stack)" for peer, idle, why in culprits(
                    stalled, self.watch, self.phase, self.loaded, self.names, version, now)))
