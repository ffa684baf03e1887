"""The run directory's own rules: a unique name, the running user's alone, one live run at a
time, no links followed.

- ``new_run_dir``: ``runs/<timestamp>-<4 hex>`` created with ``mkdir`` (which fails if it exists),
  so two runs started in the same second never share a directory.
- ``claim_run_dir``: a run directory is created 0700, or an existing one is used only when the
  running user owns it and no one else can write to it (``areal_cli/private.py``); one that
  others may read is made 0700 if it holds no run yet, else refused. ``--dry-run`` checks the
  same, changing nothing.
- ``RunLock``: ``fcntl.flock`` on ``<run_dir>/run.lock`` (``RunDir.lock``), held by ``areal train``
  (and ``resume=``) for the whole run; the file names the holder's pid. The kernel drops the lock
  when the holder dies, so a crash never leaves a stale lock behind.
- ``check_links``: the paths areal writes through or deletes under (checkpoints and the JSONL
  records) must not be symbolic links.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import os
import secrets
import stat
from pathlib import Path

from areal_cli.private import check_private_dir, make_private_dir, parent_problems
from areal_cli.rundir import RunDir


class RunDirError(ValueError):
    """A run directory that cannot be used as asked; the message says what to do."""


def new_run_dir(root: str | Path = "runs") -> Path:
    """A fresh ``<root>/<YYYYmmdd-HHMMSS>-<4 hex>`` (mode 0700), created here (never an existing
    one)."""
    Path(root).mkdir(parents=True, exist_ok=True)
    for _ in range(100):
        path = Path(root) / f"{_dt.datetime.now():%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"
        try:
            make_private_dir(path)
        except FileExistsError:
            continue
        problems = check_private_dir(path)
        if problems:
            path.rmdir()
            raise RunDirError("\n  - ".join(problems))
        return path.resolve()
    raise RunDirError(f"could not create a new run directory under {root}: give run_dir=")


def claim_run_dir(path: str | Path, dry_run: bool = False) -> bool:
    """Create ``path`` (0700; True) or check the existing directory is the running user's alone
    (False): one that others may read or enter is made 0700 where it holds no run yet, and refused
    where it does; RunDirError naming owner, mode and the fix otherwise. ``dry_run``: the same
    checks, nothing created or changed."""
    path = Path(path)
    if dry_run and not path.exists():
        problems = parent_problems(path) if path.resolve().parent.is_dir() else []
    else:
        try:
            make_private_dir(path)
            return True
        except FileExistsError:
            pass
        problems = check_private_dir(path) or _close(path, dry_run)
    if problems:
        raise RunDirError("\n  - ".join(problems))
    return False


def _close(path: Path, dry_run: bool) -> list[str]:
    """Make ``path`` (the running user's, no one else's to write) 0700 when others may read or
    enter it and it holds no run; the problem when it holds one."""
    mode = os.stat(path).st_mode
    if not mode & 0o077:
        return []
    rd = RunDir(path)
    if rd.config.exists() or rd.metrics.exists():
        return [f"run_dir={path} holds a run and other users can read it (mode "
                f"{stat.filemode(mode)}): its config and logs were open to them; chmod 700 {path} "
                "if that is acceptable (every start makes new keys), or choose another run_dir"]
    if not dry_run:
        path.chmod(0o700)
    return []


def taken_problems(run_dir: str | Path, resume: str) -> list[str]:
    """A run directory that holds a run (unless resumed), or a link among the paths a run writes
    through."""
    out = []
    if not resume and RunDir(run_dir).metrics.exists():
        out.append(f"run_dir={run_dir} already holds a run; continue it with resume={run_dir} or "
                   "choose another run_dir")
    return out + check_links(run_dir)


class RunLock:
    """An exclusive lock on a run directory for as long as this object lives (or ``release``)."""

    def __init__(self, run_dir: str | Path):
        self.path = RunDir(run_dir).lock
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.is_symlink():
            raise RunDirError(f"{self.path} is a symbolic link: remove it")
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self.fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(self.fd)
            gone = holder.isdigit() and not os.path.exists(f"/proc/{holder}")
            exited = (", exited; a process it started still runs: `pgrep -af <run_dir>`"
                      if gone else "")
            raise RunDirError(f"run_dir={Path(run_dir)} is in use by another areal run (pid "
                              f"{holder}{exited}); wait for it to end or stop it, or choose "
                              "another run_dir") from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{os.getpid()}\n".encode(), 0)

    @classmethod
    def adopt(cls, run_dir: str | Path, fd: int) -> RunLock:
        """The lock a process that exec'ed into this one holds on descriptor ``fd``."""
        lock = cls.__new__(cls)
        lock.path, lock.fd = RunDir(run_dir).lock, fd
        os.set_inheritable(fd, False)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return lock

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing the last descriptor drops the flock
            self.fd = -1


def check_links(run_dir: str | Path) -> list[str]:
    """Every symbolic link among the paths a run writes through or deletes under, as a problem."""
    d = RunDir(run_dir)
    links = [p for p in d.no_links if p.is_symlink()]
    ckpts = d.checkpoints
    if ckpts.is_dir() and not ckpts.is_symlink():
        links += sorted(p for p in ckpts.iterdir() if p.is_symlink())
    return [f"{p} is a symbolic link; areal never writes or deletes through links inside a run "
            "directory: replace it with the real file or directory" for p in links]
