"""Trainer rank 0 → every other trainer rank: a message as tensors, never a pickle.

Rank 0 receives each batch from the controller (and validates it); the other ranks get the
same message — a ``Batch``, a ``Stop`` or nothing (rank 0 is still waiting), the ``"ranks"``
channel of ``messages.CHANNELS`` — through two broadcasts in the trainer's process group: its
length as an int64, then its msgpack frame as a uint8 tensor. Nothing is unpickled, so a rank
can never be made to run code by what it receives.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from areal_cli.transport.messages import CHANNELS, decode, encode


def share_message(msg, device: torch.device):
    """Rank 0's ``msg`` (a message of the ranks channel, or None) on every rank (a collective:
    every rank calls it; the argument of ranks other than 0 is ignored)."""
    rank0 = dist.get_rank() == 0
    frame = share_frame(encode(msg) if rank0 and msg is not None else b"", device)
    if rank0:
        return msg
    return decode(frame, CHANNELS["ranks"]) if frame else None


def share_frame(frame: bytes, device: torch.device) -> bytes:
    """Rank 0's ``frame`` on every rank (a collective)."""
    rank0 = dist.get_rank() == 0
    head = torch.tensor([len(frame) if rank0 else 0], dtype=torch.int64, device=device)
    dist.broadcast(head, src=0)
    size = int(head[0])
    if not size:
        return b""
    if rank0:
        data = torch.frombuffer(bytearray(frame), dtype=torch.uint8).to(device)
    else:
        data = torch.empty(size, dtype=torch.uint8, device=device)
    dist.broadcast(data, src=0)
    return frame if rank0 else data.cpu().numpy().tobytes()
