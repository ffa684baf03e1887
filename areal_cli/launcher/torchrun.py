"""torchrun whose rendezvous stores listen on the rendezvous host only.

``python -m areal_cli.launcher.torchrun [torchrun options] -m module ...`` is torchrun with two
more rendezvous backends. torch 2.13 has no option for the address a store listens on:
``--master-addr`` and ``--rdzv-endpoint`` only name the address to advertise, and every
store torchrun creates listens on all interfaces (``*:PORT`` in ``ss -ltnp``). These create
the same stores on a socket bound to the host alone (``weights.bound_store``):

* ``areal`` (one node; the local launcher): torchrun's static rendezvous,
  ``--rdzv-endpoint=HOST:PORT --rdzv-conf=rank=0``. With ``AREAL_RANKS_STORE`` (what the local
  launcher sets) no store listens at all: the agent keeps its own in memory and the ranks meet in
  that FileStore inside the 0700 run directory, so only the run's user (and root) can read or
  write a key. Without it, rank 0's store on HOST is also the store the trainer ranks use
  (``TORCHELASTIC_USE_AGENT_STORE``).
* ``areal-c10d`` (Slurm, one agent per node): torchrun's c10d rendezvous,
  ``--rdzv-endpoint=HOST:PORT``. The rendezvous store listens on HOST (on the node whose
  name or address HOST is); the store the ranks share, which the agent that becomes rank 0
  creates, listens on that node's own address (what its fully qualified name resolves to).
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta


def _static(params):
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import (
        StaticTCPRendezvous,
        create_rdzv_handler,
    )

    from areal_cli.transport.weights import bound_store

    class BoundStaticRendezvous(StaticTCPRendezvous):
        def get_backend(self) -> str:
            return "areal"

        def next_rendezvous(self):
            if self._store is None and os.environ.get("AREAL_RANKS_STORE") and self.world_size == 1:
                # one agent, whose ranks meet in a FileStore of the run directory (trainer/main.py):
                # its own store stays in this process, and no store listens on any port
                self._store = dist.HashStore()
            elif self._store is None and self.rank == 0:
                self._store = bound_store(self.master_addr, self.master_port, self.world_size,
                                          self.timeout,
                                          multi_tenant=True)
            return super().next_rendezvous()

    h = create_rdzv_handler(params)  # validates the endpoint and rank
    return BoundStaticRendezvous(h.master_addr, h.master_port, int(h.rank), h.world_size, h.run_id,
                                 int(h.timeout.total_seconds()))


def _c10d(params):
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler
    from torch.distributed.elastic.rendezvous.utils import (
        _matches_machine_hostname,
        parse_rendezvous_endpoint,
    )

    from areal_cli.transport.weights import bound_store

    class Backend(C10dRendezvousBackend):
        @property
        def name(self) -> str:
            return "areal-c10d"

    host, port = parse_rendezvous_endpoint(params.endpoint, default_port=29400)
    timeout = timedelta(seconds=params.get_as_int("read_timeout", 60))
    is_host = params.get_as_bool("is_host")
    store = None
    if is_host or (is_host is None and _matches_machine_hostname(host)):
        try:
            store = bound_store(host, port, None, timeout, multi_tenant=True)
        except (OSError, RuntimeError):  # another agent on this machine hosts it (as torchrun does)
            if is_host:
                raise
    if store is None:
        store = dist.TCPStore(host, port, is_master=False, timeout=timeout)
    handler = create_handler(store, Backend(store, params.run_id), params)
    handler._create_tcp_store_server = lambda addr, p: bound_store(addr, p, None, timeout,
                                                                   multi_tenant=True)
    return handler


def main(argv: list[str]) -> None:
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry
    from torch.distributed.run import main as torchrun

    rendezvous_handler_registry.register("areal", _static)
    rendezvous_handler_registry.register("areal-c10d", _c10d)
    torchrun(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
