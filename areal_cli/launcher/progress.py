"""Live progress: on a terminal a rich bar (steps, ETA) over a table of the last steps (reward,
staleness, tokens/s, weight sync); plain lines otherwise; fed by metrics.jsonl."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from areal_cli.rundir import RunDir


class MetricsTail:
    """The rows of a growing metrics.jsonl. The controller may replace the file beneath it (resume
    drops the steps after its checkpoint, atomically: a new inode) or a line may be torn (a kill
    mid-write): the tail then starts over from the new file, and skips a line that is not JSON."""

    def __init__(self, path: Path):
        self.path, self.pos, self.rows, self.inode = path, 0, [], None
        self.last = b""  # the last whole line read, which must still end at ``pos``
        self.bad_lines = 0

    def read(self) -> list[dict]:
        try:
            with self.path.open("rb") as f:
                st = os.fstat(f.fileno())
                if st.st_ino != self.inode or st.st_size < self.pos:
                    return self._restart(f, st.st_ino)
                f.seek(self.pos - len(self.last))
                chunk = f.read()
                if not chunk.startswith(self.last):  # rewritten beneath us (an inode number reused)
                    f.seek(0)
                    return self._restart(f, st.st_ino)
        except FileNotFoundError:
            return []
        new = self._parse(chunk[len(self.last):])
        self.rows += new
        return new

    def _restart(self, f, inode: int) -> list[dict]:
        """A new or shorter file: read it from the start; the rows that differ from the ones
        already shown are the new ones."""
        self.inode, self.pos, self.last = inode, 0, b""
        old, self.rows = self.rows, self._parse(f.read())
        same = 0
        while same < min(len(old), len(self.rows)) and old[same] == self.rows[same]:
            same += 1
        return self.rows[same:]

    def _parse(self, chunk: bytes) -> list[dict]:
        done = chunk.rfind(b"\n") + 1  # an unfinished last line waits for the next read
        self.pos += done
        if done:
            self.last = chunk[chunk.rfind(b"\n", 0, done - 1) + 1:done]
        out = []
        for line in chunk[:done].decode(errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                row = None
            if isinstance(row, dict) and isinstance(row.get("step"), int):
                out.append(row)
            else:
                self.bad_lines += 1  # a torn line (a kill mid-write): resume drops it and says so
        return out


def fmt_line(row: dict, steps: int, eta: float | None) -> str:
    return (f"step {row['step'] + 1}/{steps}  reward {row.get('reward_mean', 0):.3f}  staleness "
            f"max {row.get('staleness_max', 0)} mean {row.get('staleness_mean', 0):.2f}  gen "
            f"{row.get('gen_tokens_per_s', 0):.0f} tok/s  train "
            f"{row.get('train_tokens_per_s', 0):.0f} tok/s  sync "
            f"{row.get('weight_sync_s', 0) * 1000:.0f} ms  wall "
            f"{row.get('wall_time_s', 0):.0f}s" + (f"  ETA {eta:.0f}s" if eta is not None else "")
            + "".join(f"  {k} {v:.3f}" for k, v in row.items() if k.endswith("/accuracy")))


class Progress:
    """Call ``update()`` often; it prints/redraws when new steps arrive."""

    def __init__(self, run_dir: Path, steps: int, label: str = "train"):
        self.tail = MetricsTail(RunDir(run_dir).metrics)
        self.steps, self.t0 = steps, time.monotonic()
        self.tty = sys.stdout.isatty()
        self.live = None
        self.label = label
        if self.tty:
            from rich.live import Live

            self.live = Live(self._view(), refresh_per_second=2, transient=False)
            self.live.start()
        else:
            print(f"[{label}] started; progress every step (metrics.jsonl in {run_dir})",
                  flush=True)

    def _eta(self) -> float | None:
        rows = self.tail.rows
        if len(rows) < 2:
            return None
        per = (rows[-1].get("wall_time_s", 0) - rows[0].get("wall_time_s", 0)) / (len(rows) - 1)
        return max(0.0, per * (self.steps - rows[-1]["step"] - 1))

    def _view(self):
        """The bar (steps done of all, ETA) above the table."""
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        eta = self._eta()
        head = Table.grid(padding=(0, 1))
        head.add_row(ProgressBar(total=self.steps, completed=len(self.tail.rows), width=40),
                     f"{len(self.tail.rows)}/{self.steps} steps"
                     + (f"  ETA {eta:.0f}s" if eta is not None else ""))
        return Group(head, self._table())

    def _table(self):
        from rich.table import Table

        t = Table(title=f"areal {self.label}: {len(self.tail.rows)}/{self.steps} steps, "
                        f"{time.monotonic() - self.t0:.0f}s", expand=False)
        for col in ("step", "reward", "staleness max/mean", "gen tok/s", "train tok/s", "sync ms",
                    "ETA s"):
            t.add_column(col, justify="right")
        for r in self.tail.rows[-8:]:
            t.add_row(str(r["step"] + 1), f"{r.get('reward_mean', 0):.3f}",
                      f"{r.get('staleness_max', 0)}/{r.get('staleness_mean', 0):.2f}",
                      f"{r.get('gen_tokens_per_s', 0):.0f}",
                      f"{r.get('train_tokens_per_s', 0):.0f}",
                      f"{r.get('weight_sync_s', 0) * 1000:.0f}", f"{self._eta() or 0:.0f}")
        return t

    def update(self) -> None:
        new = self.tail.read()
        if self.live is not None:
            self.live.update(self._view())
        else:
            for row in new:
                print(fmt_line(row, self.steps, self._eta()), flush=True)

    def close(self) -> None:
        self.update()
        if self.live is not None:
            self.live.stop()
