"""Live progress: a rich table on a terminal, plain lines otherwise; fed by metrics.jsonl."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


class MetricsTail:
    def __init__(self, path: Path):
        self.path, self.pos, self.rows = path, 0, []

    def read(self) -> list[dict]:
        if not self.path.exists():
            return []
        with self.path.open() as f:
            f.seek(self.pos)
            chunk = f.read()
        done = chunk.rfind("\n") + 1
        self.pos += done
        new = [json.loads(line) for line in chunk[:done].splitlines() if line.strip()]
        self.rows += new
        return new


def fmt_line(row: dict, steps: int, eta: float | None) -> str:
    return (f"step {row['step'] + 1}/{steps}  reward {row.get('reward_mean', 0):.3f}  "
            f"staleness max {row.get('staleness_max', 0)} mean {row.get('staleness_mean', 0):.2f}  "
            f"gen {row.get('gen_tokens_per_s', 0):.0f} tok/s  train {row.get('train_tokens_per_s', 0):.0f} tok/s  "
            f"sync {row.get('weight_sync_s', 0) * 1000:.0f} ms  "
            f"wall {row.get('wall_time_s', 0):.0f}s" + (f"  ETA {eta:.0f}s" if eta is not None else "")
            + "".join(f"  {k} {v:.3f}" for k, v in row.items() if k.endswith("/accuracy")))


class Progress:
    """Call ``update()`` often; it prints/redraws when new steps arrive."""

    def __init__(self, run_dir: Path, steps: int, label: str = "train"):
        self.tail, self.steps, self.t0 = MetricsTail(run_dir / "metrics.jsonl"), steps, time.monotonic()
        self.tty = sys.stdout.isatty()
        self.live = None
        self.label = label
        if self.tty:
            from rich.live import Live

            self.live = Live(self._table(), refresh_per_second=2, transient=False)
            self.live.start()
        else:
            print(f"[{label}] started; progress every step (metrics.jsonl in {run_dir})", flush=True)

    def _eta(self) -> float | None:
        rows = self.tail.rows
        if len(rows) < 2:
            return None
        per = (rows[-1]["wall_time_s"] - rows[0]["wall_time_s"]) / (len(rows) - 1)
        return per * (self.steps - rows[-1]["step"] - 1)

    def _table(self):
        from rich.table import Table

        t = Table(title=f"areal {self.label}: {len(self.tail.rows)}/{self.steps} steps, "
                        f"{time.monotonic() - self.t0:.0f}s", expand=False)
        for col in ("step", "reward", "staleness max/mean", "gen tok/s", "train tok/s", "sync ms", "ETA s"):
            t.add_column(col, justify="right")
        for r in self.tail.rows[-8:]:
            t.add_row(str(r["step"] + 1), f"{r.get('reward_mean', 0):.3f}",
                      f"{r.get('staleness_max', 0)}/{r.get('staleness_mean', 0):.2f}",
                      f"{r.get('gen_tokens_per_s', 0):.0f}", f"{r.get('train_tokens_per_s', 0):.0f}",
                      f"{r.get('weight_sync_s', 0) * 1000:.0f}", f"{self._eta() or 0:.0f}")
        return t

    def update(self) -> None:
        new = self.tail.read()
        if self.live is not None:
            self.live.update(self._table())
        else:
            for row in new:
                print(fmt_line(row, self.steps, self._eta()), flush=True)

    def close(self) -> None:
        self.update()
        if self.live is not None:
            self.live.stop()
