"""The run directory as a trust boundary: only the user running areal (and root) can change it.

A run starts processes, loads keys and reads back addresses from its run directory; whoever can
write there could steer them. So:

- ``make_private_dir``: a new run directory is created with mode 0700 by the running user.
- ``check_private_dir``: an existing one is used only when the running user owns it and neither
  group nor others can write to it, and the directory holding it cannot be used to swap it (owned
  by the user or root, and writable by others only with the sticky bit, as ``/tmp``);
  ``launcher/claim.py`` then makes one that others may read 0700 (or refuses it, if it holds a
  run).
- ``read_private``: a file areal reads back from a run directory (config.yaml, endpoints.json,
  keys) is opened without following a symbolic link and read only when the running user owns it
  and no one else can write to it.

Nothing read from a run directory is ever executed: the launcher passes the commands it planned
to the process that starts them in memory (``launcher/run.py``), not through a file.
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


def owner_name(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _who() -> str:
    return owner_name(os.geteuid())


def make_private_dir(path: str | Path) -> Path:
    """Create ``path`` (mode 0700; missing parents with the default mode); FileExistsError if it
    exists."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.mkdir(mode=0o700)
    path.chmod(0o700)  # mkdir's mode is masked by the umask, never widened: this is exact
    return path


def check_private_dir(path: str | Path) -> list[str]:
    """The reasons ``path`` (an existing directory) cannot be a run directory, each naming the
    fix."""
    path = Path(path)
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        return [f"run_dir={path} is not a directory: choose another run_dir"]
    problems = []
    if st.st_uid != os.geteuid():
        problems.append(f"run_dir={path} belongs to {owner_name(st.st_uid)}, not to {_who()} who "
                        f"runs areal (mode {stat.filemode(st.st_mode)}): its owner could change "
                        "what this run starts; choose a run_dir of your own (or leave run_dir "
                        "unset for a fresh one)")
    elif st.st_mode & OTHERS_WRITE:
        problems.append(f"run_dir={path} can be written by other users (mode "
                        f"{stat.filemode(st.st_mode)}, owner {owner_name(st.st_uid)}): chmod go-w "
                        f"{path} (or chmod 700), or choose another run_dir")
    return problems + parent_problems(path)


def parent_problems(path: str | Path) -> list[str]:
    """Why the directory holding ``path`` (which itself may not exist yet) lets another user swap
    it, naming the fix; [] when it does not."""
    parent = Path(path).resolve().parent
    pst = os.stat(parent)
    if (pst.st_uid not in (0, os.geteuid())
            or pst.st_mode & OTHERS_WRITE and not pst.st_mode & stat.S_ISVTX):
        return [f"{parent}, which holds run_dir={path}, can be changed by another user (owner "
                f"{owner_name(pst.st_uid)}, mode {stat.filemode(pst.st_mode)}), who could swap the "
                "run directory: put the run in a directory of your own"]
    return []


def read_private(path: str | Path) -> bytes:
    """The bytes of ``path``, opened without following a symbolic link; ValueError naming the fix
    when it is a link, not a regular file, not the running user's, or writable by anyone else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as err:
        if err.errno == 40:  # ELOOP: the last component is a symbolic link
            raise ValueError(f"{path} is a symbolic link; areal reads its run files only directly: "
                             "remove the link (and check who made it)") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path} is not a regular file: remove it")
        if st.st_uid != os.geteuid():
            raise ValueError(f"{path} belongs to {owner_name(st.st_uid)}, not to {_who()} who runs "
                             "areal: someone else wrote into this run directory; start the run in "
                             "a directory of your own")
        if st.st_mode & OTHERS_WRITE:
            raise ValueError(f"{path} can be written by other users (mode "
                             f"{stat.filemode(st.st_mode)}): chmod go-w {path}")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
