"""Trainer rank 0 → every other trainer rank: a frame as tensors, never a pickle.

Rank 0 receives each batch from the controller (and validates it); the other ranks get the
same msgpack frame through two broadcasts in the trainer's process group: a header of two
int64 (what it is, its length), then the frame's bytes as a uint8 tensor. Nothing is
unpickled, so a rank can never be made to run code by what it receives.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

WAIT, BATCH, STOP = 0, 1, 2  # what rank 0 tells the other ranks while they wait for a batch


def share_frame(what: int, frame: bytes, device: torch.device) -> tuple[int, bytes]:
    """Rank 0's ``(what, frame)`` on every rank (a collective: every rank calls it; the
    arguments of ranks other than 0 are ignored)."""
    rank0 = dist.get_rank() == 0
    head = torch.tensor([what, len(frame)] if rank0 else [0, 0], dtype=torch.int64, device=device)
    dist.broadcast(head, src=0)
    what, size = int(head[0]), int(head[1])
    if not size:
        return what, b""
    if rank0:
        data = torch.frombuffer(bytearray(frame), dtype=torch.uint8).to(device)
    else:
        data = torch.empty(size, dtype=torch.uint8, device=device)
    dist.broadcast(data, src=0)
    return what, frame if rank0 else data.cpu().numpy().tobytes()
