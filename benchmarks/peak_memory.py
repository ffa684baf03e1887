"""Peak memory of a command and every process it starts, as the sum of proportional set sizes.

    python benchmarks/peak_memory.py [--interval 1] [--out mem.json] -- make train

Every ``interval`` seconds it reads ``/proc/<pid>/smaps_rollup`` of the command and all its
descendants and sums their ``Pss`` (shared pages are split between the processes that map them,
so torch's libraries count once in all). It prints the peak of that sum, the peak of each
process name (its command line's module or script), each process's share at the moment of the
peak, the wall time and the command's exit code.
Linux only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def children_of() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(d.name))
    return tree


def descendants(root: int) -> list[int]:
    tree, out, todo = children_of(), [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += tree.get(pid, [])
    return out


def pss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def label(pid: int) -> str:
    """``-m module`` or the script name of a process's command line."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    args = [a.decode(errors="replace") for a in argv if a]
    if "-m" in args[:-1]:
        return args[args.index("-m") + 1]
    scripts = [a for a in args[1:] if not a.startswith("-")]
    return Path(scripts[0]).name if scripts else Path(args[0]).name if args else "?"


def _gb(kb_by_name: dict[str, int]) -> dict[str, float]:
    return {k: round(v / 2**20, 3) for k,
            v in sorted(kb_by_name.items(), key=lambda kv: -kv[1]) if v}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    ap.add_argument("--out", default="", help="write the figures as JSON here too")
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- the command")
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        ap.error("give the command after --")
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd)
    peak_total, peak_at, per_name, samples, at_peak = 0, 0.0, {}, 0, {}
    while proc.poll() is None:
        by_name: dict[str, int] = {}
        for pid in descendants(proc.pid):
            kb = pss_kb(pid)
            name = label(pid)
            by_name[name] = by_name.get(name, 0) + kb
        total = sum(by_name.values())
        samples += 1
        if total > peak_total:
            peak_total, peak_at, at_peak = total, time.monotonic() - t0, dict(by_name)
        for name, kb in by_name.items():
            per_name[name] = max(per_name.get(name, 0), kb)
        time.sleep(a.interval)
    wall = time.monotonic() - t0
    result = {"cmd": cmd, "exit_code": proc.returncode, "wall_s": round(wall, 1),
              "samples": samples,
              "peak_pss_gb": round(peak_total / 2**20, 3), "peak_at_s": round(peak_at, 1),
              "at_peak_gb_by_process": _gb(at_peak), "peak_pss_gb_by_process": _gb(per_name)}
    print(json.dumps(result, indent=1), file=sys.stderr)
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
