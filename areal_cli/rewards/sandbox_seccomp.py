"""A seccomp filter for the sandbox (bubblewrap's --seccomp): the kernel interfaces a program
under test never needs and an escape often starts from fail with EPERM.

Denied: new namespaces (unshare, setns, clone with a CLONE_NEW* flag; clone3, whose flags a
filter cannot read, says ENOSYS so the C library falls back to clone), mounts, ptrace and
process_vm_*, keyrings, file handles, bpf, perf events, userfaultfd, io_uring, kernel modules
and kexec; and memory that no process's size shows: memfd files (memfd_create, memfd_secret),
SysV shared memory and message queues (shmget, msgget), and sockets (socket, socketpair: the
sandbox has no network, and a socket's buffers hold up to SO_SNDBUF of kernel memory each).
Anything else is allowed. A system call of another ABI (i386 or x32 on x86_64) kills
the process, so the numbers below cannot be dodged. x86_64 and aarch64 only; elsewhere None.
"""

from __future__ import annotations

import platform
import struct

DENIED = (
    "ptrace process_vm_readv process_vm_writev keyctl add_key request_key mount umount2 "
    "pivot_root unshare setns open_by_handle_at name_to_handle_at bpf perf_event_open "
    "userfaultfd kexec_load kexec_file_load init_module finit_module delete_module "
    "io_uring_setup io_uring_enter io_uring_register open_tree move_mount fsopen fsconfig "
    "fsmount fspick mount_setattr memfd_create memfd_secret shmget msgget socket socketpair"
).split()
# from <asm/unistd_64.h> (x86_64) and <asm-generic/unistd.h> (aarch64)
NUMBERS = {
    "x86_64": dict(zip(DENIED + ["clone", "clone3"], [
        101, 310, 311, 250, 248, 249, 165, 166, 155, 272, 308, 304, 303, 321, 298, 323, 246,
        320, 175, 313, 176, 425, 426, 427, 428, 429, 430, 431, 432, 433, 442, 319, 447, 29, 68,
        41, 53, 56, 435,
    ], strict=True)),
    "aarch64": dict(zip(DENIED + ["clone", "clone3"], [
        117, 270, 271, 219, 217, 218, 40, 39, 41, 97, 268, 265, 264, 280, 241, 282, 104,
        294, 105, 273, 106, 425, 426, 427, 428, 429, 430, 431, 432, 433, 442, 279, 447, 194,
        186, 198, 199, 220, 435,
    ], strict=True)),
}  # fmt: skip
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
X32_BIT = 0x40000000
CLONE_NEW = 0x7E020080  # NEWNS NEWCGROUP NEWUTS NEWIPC NEWUSER NEWPID NEWNET NEWTIME
LD_ABS, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
ALLOW, KILL_PROCESS = 0x7FFF0000, 0x80000000
EPERM, ENOSYS = 0x00050000 | 1, 0x00050000 | 38
NR, ARCH, ARG0 = 0, 4, 16  # offsets in struct seccomp_data (arg 0's low half: little-endian)


def program(sockets: bool = False) -> bytes | None:
    """The filter as struct sock_filter[], or None where this machine's numbers are unknown;
    ``sockets``: socket and socketpair allowed (an agent's program, whose network namespace holds
    only the endpoint it calls)."""
    machine = platform.machine()
    if machine not in NUMBERS:
        return None
    nr = NUMBERS[machine]
    denied = [n for n in DENIED if not (sockets and n in ("socket", "socketpair"))]
    ops = [(LD_ABS, 0, 0, ARCH), (JEQ, 1, 0, AUDIT_ARCH[machine]), (RET, 0, 0, KILL_PROCESS)]
    ops += [(LD_ABS, 0, 0, NR)]
    if machine == "x86_64":
        ops += [(JGE, 0, 1, X32_BIT), (RET, 0, 0, KILL_PROCESS)]
    ops += [(JEQ, 0, 1, nr["clone3"]), (RET, 0, 0, ENOSYS)]
    ops += [(JEQ, 0, 4, nr["clone"]), (LD_ABS, 0, 0, ARG0), (JSET, 0, 1, CLONE_NEW)]
    ops += [(RET, 0, 0, EPERM), (RET, 0, 0, ALLOW)]
    for name in denied:
        ops += [(JEQ, 0, 1, nr[name]), (RET, 0, 0, EPERM)]
    ops += [(RET, 0, 0, ALLOW)]
    return b"".join(struct.pack("=HBBI", *op) for op in ops)
