"""An episode's clock: what ``workflow.agent_timeout_s`` measures is the agent's own time.

An episode's wall time splits into the time at least one of its calls is in the engine (queued
behind other episodes' sequences, or generating; calls in flight together counted once) and the
rest, the agent's own (its code, its tools, its HTTP round trips). ``agent_timeout_s`` bounds the
agent's own time, so a busy engine — many episodes, a weight update, a long generation — never times
a healthy episode out; ``agent_wall_timeout_s`` (0: none) bounds the whole wall time, engine
included. Both clocks start when the episode starts running (a free ``agent_concurrency`` slot),
not when its group arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time

CANCEL_WAIT_S = 5.0  # how long a timed-out agent's cancellation is waited for


class EpisodeClock:
    """The agent's own time and the engine's time of one episode (used in the endpoint's loop)."""

    def __init__(self, limit_s: float = 300.0, wall_s: float = 0.0):
        self.limit_s, self.wall_s = limit_s, wall_s
        self.t0: float | None = None
        self.t1: float | None = None  # when the episode ended (stop)
        self.engine_s = 0.0  # closed spans with a call in the engine
        self.calls = 0  # calls in the engine now
        self.since = 0.0  # when the open span began (calls > 0)
        self.wake: asyncio.Future | None = None  # resolved when the last call leaves the engine

    def start(self) -> None:
        self.t0 = time.monotonic()

    def stop(self) -> None:
        self.t1 = time.monotonic()

    def spent(self) -> tuple[float, float] | None:
        """(engine, own) seconds of an episode that ran and ended, else None."""
        if self.t0 is None or self.t1 is None:
            return None
        return self.engine_time(self.t1), self.own_time(self.t1)

    @contextlib.contextmanager
    def in_engine(self):
        """A call's time in the engine, from its submission to its last sequence's end."""
        if self.calls == 0:
            self.since = time.monotonic()
        self.calls += 1
        try:
            yield
        finally:
            self.calls -= 1
            if self.calls == 0:
                self.engine_s += time.monotonic() - self.since
                if self.wake is not None and not self.wake.done():
                    self.wake.set_result(None)

    def engine_time(self, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        return self.engine_s + (now - self.since if self.calls else 0.0)

    def own_time(self, now: float | None = None) -> float:
        """Wall time since the start, less the engine's."""
        now = time.monotonic() if now is None else now
        return (now - (self.t0 if self.t0 is not None else now)) - self.engine_time(now)

    def _left(self) -> tuple[float, str]:
        """Seconds until a limit can pass at the earliest (inf: none can while a call is in the
        engine and no wall limit is set), and why it passes then."""
        now = time.monotonic()
        wall = self.wall_s - (now - self.t0) if self.wall_s else math.inf
        own = math.inf if self.calls else self.limit_s - self.own_time(now)
        if wall <= own:
            return wall, (f"ran past workflow.agent_wall_timeout_s={self.wall_s:g}s of wall time "
                          f"({self.engine_time(now):.1f}s of it in the engine)")
        return own, (f"ran past workflow.agent_timeout_s={self.limit_s:g}s of its own time "
                     f"({self.engine_time(now):.1f}s waiting for the engine not counted)")

    async def bound(self, work):
        """``work``'s result, or TimeoutError (its message names the limit) once the agent's own
        time passes ``limit_s`` or the wall time ``wall_s``; ``work`` is then cancelled."""
        if self.t0 is None:
            self.start()
        task = asyncio.ensure_future(work)
        loop = asyncio.get_running_loop()
        try:
            while True:
                left, why = self._left()
                if left <= 0:
                    raise TimeoutError(why)
                self.wake = loop.create_future()
                await asyncio.wait({task, self.wake}, return_when=asyncio.FIRST_COMPLETED,
                                   timeout=None if math.isinf(left) else left)
                if task.done():
                    return task.result()
        finally:
            if not task.done():
                task.cancel()
                await asyncio.wait({task}, timeout=CANCEL_WAIT_S)
