"""The weight broadcast between processes on one GPU (``weights.backend=ipc``): device to device
through CUDA IPC, where NCCL refuses two ranks on one GPU and gloo would go through host memory.

``IpcGroup`` answers the one collective the weight transfer uses, ``broadcast`` from rank 0, with
the semantics of NCCL's: every receiver's buffer ends up holding rank 0's tensor. A receiver
announces its buffer (a CUDA IPC handle of the buffer's memory, sent once per allocation, then only
its offset and size) over a gloo group of the same ranks; rank 0 opens the handle (torch keeps it
open), copies its tensor into the receiver's buffer on the GPU, waits for the copy and tells the
receiver it is done. So the bytes move once, on the device, at the GPU's memory bandwidth; only a
few dozen bytes per bucket cross the loopback.

A receiver's earlier reads of the buffer (the loads of the bucket it held before) finish before it
announces the buffer again, so the sender never overwrites a bucket still being loaded. The
processes must see the same GPU (one physical GPU each, as the launcher places colocated
processes); the handle is opened on the sender's own device.
"""

from __future__ import annotations

import msgpack
import torch
import torch.distributed as dist

# header of an announcement: the buffer's id, its element offset, its element count, and the
# length of the IPC handle (msgpack) that follows (0: the buffer was announced before)
_HEADER = 4


class _Done:
    """A work that has already finished (rank 0's copies are complete when broadcast returns)."""

    def wait(self, timeout=None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


class _Awaiting:
    """A receiver's work: done when rank 0 says its copy into the buffer is complete."""

    def __init__(self, work):
        self.work = work

    def wait(self, timeout=None) -> bool:
        self.work.wait()
        return True

    def is_completed(self) -> bool:
        return self.work.is_completed()


class IpcGroup:
    """``broadcast`` from rank 0 of ``world_size`` processes on one GPU, over the gloo group
    ``control`` of the same ranks (see the module's docstring)."""

    def __init__(self, control, rank: int, world_size: int):
        self.control, self.rank, self.world_size = control, rank, world_size
        # a receiver's buffers rank 0 holds a handle of, kept alive (their memory is never reused
        # for another buffer while rank 0 may write into it)
        self._announced: dict[int, torch.UntypedStorage] = {}
        self._opened: dict[tuple[int, int], torch.Tensor] = {}  # rank 0: (rank, id) → buffer

    def broadcast(self, tensors: list[torch.Tensor], opts=None):
        (tensor,) = tensors
        if not tensor.is_cuda:
            raise ValueError("weights.backend=ipc moves GPU tensors only: the trainer and the "
                             "rollout worker must both be on the GPU")
        if opts is not None and opts.rootRank != 0:
            raise ValueError("IpcGroup broadcasts from rank 0 only")
        return self._send(tensor) if self.rank == 0 else self._post(tensor)

    def _post(self, tensor: torch.Tensor) -> _Awaiting:
        """Announce ``tensor`` (a view of a buffer) as the destination of the next broadcast."""
        if not tensor.is_contiguous():
            raise ValueError("weights.backend=ipc receives into contiguous buffers only")
        # the buffer's earlier readers (the loads of the bucket it held) are done before it refills
        torch.cuda.current_stream(tensor.device).synchronize()
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        handle = b""
        if key not in self._announced:
            # (device, handle, size, offset, ref-counter file, its offset, event handle, whether
            # to wait for the event): ints, bytes and a bool, no object of ours crosses
            handle = msgpack.packb(list(storage._share_cuda_()), use_bin_type=True)
            self._announced[key] = storage
        header = torch.tensor([key, tensor.storage_offset(), tensor.numel(), len(handle)],
                              dtype=torch.int64)
        self.control.send([header], 0, 0).wait()
        if handle:
            self.control.send([torch.frombuffer(bytearray(handle), dtype=torch.uint8)], 0,
                              1).wait()
        done = torch.zeros(1, dtype=torch.int64)
        return _Awaiting(self.control.recv([done], 0, 2))

    def _send(self, tensor: torch.Tensor) -> _Done:
        """Copy ``tensor`` into every receiver's announced buffer and tell each it is done."""
        dests = []
        for peer in range(1, self.world_size):
            header = torch.zeros(_HEADER, dtype=torch.int64)
            self.control.recv([header], peer, 0).wait()
            key, offset, numel, size = (int(v) for v in header.tolist())
            if size:
                raw = torch.empty(size, dtype=torch.uint8)
                self.control.recv([raw], peer, 1).wait()
                self._opened[(peer, key)] = open_handle(bytes(raw.numpy()), tensor.dtype,
                                                        tensor.device)
            whole = self._opened.get((peer, key))
            if whole is None:
                raise RuntimeError(f"rollout rank {peer} named a buffer it never announced")
            if offset < 0 or offset + numel > whole.numel():
                raise RuntimeError(f"rollout rank {peer} named elements {offset}..{offset + numel} "
                                   f"of a buffer of {whole.numel()}")
            if numel != tensor.numel() or whole.dtype != tensor.dtype:
                raise RuntimeError(f"rollout rank {peer} awaits {numel} {whole.dtype} elements; "
                                   f"the bucket has {tensor.numel()} {tensor.dtype}: the two ends "
                                   "planned different buckets")
            dests.append(whole[offset:offset + numel])
        for dst in dests:
            dst.copy_(tensor.reshape(-1), non_blocking=True)
        torch.cuda.current_stream(tensor.device).synchronize()
        for peer in range(1, self.world_size):
            self.control.send([torch.ones(1, dtype=torch.int64)], peer, 2).wait()
        return _Done()

    def close(self) -> None:
        self._opened.clear()
        self._announced.clear()


def open_handle(handle: bytes, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The buffer a receiver shared (its storage's ``_share_cuda_`` fields, msgpack), opened on
    ``device`` as a flat tensor of ``dtype``: the receiver's index of the GPU may differ from ours,
    the GPU is the same. Fields of another shape: RuntimeError."""
    fields = msgpack.unpackb(handle, raw=False)
    handle = (bytes, type(None))  # None where torch has none (no event to wait for)
    kinds = (int, bytes, int, int, handle, int, handle, bool)
    if (not isinstance(fields, list) or len(fields) != len(kinds)
            or not all(isinstance(f, k) for f, k in zip(fields, kinds, strict=True))):
        raise RuntimeError("a rollout rank sent something other than a CUDA buffer's IPC handle")
    _, ipc, size, offset, counter, counter_offset, event, sync = fields
    index = device.index if device.index is not None else torch.cuda.current_device()
    torch.cuda._lazy_init()
    storage = torch.UntypedStorage._new_shared_cuda(index, ipc, size, offset, counter,
                                                    counter_offset, event, sync)
    return torch.empty(0, dtype=dtype, device=device).set_(storage)


def ipc_group(store, rank: int, world_size: int, gloo_options) -> IpcGroup:
    """The group over ``store``: its control messages on a gloo group of the same ranks."""
    control = dist.ProcessGroupGloo(dist.PrefixStore("ipc", store), rank, world_size,
                                    gloo_options)
    return IpcGroup(control, rank, world_size)
