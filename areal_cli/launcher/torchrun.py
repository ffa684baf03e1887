"""torchrun whose rendezvous store listens on the rendezvous host only.

``python -m areal_cli.launcher.torchrun --rdzv-backend=areal --rdzv-endpoint=HOST:PORT
--rdzv-conf=rank=0 [torchrun options] -m module ...`` is torchrun with one more rendezvous
backend, ``areal``: torchrun's static rendezvous, except that the store of node rank 0 (which
the trainer ranks also use, ``TORCHELASTIC_USE_AGENT_STORE``) listens on HOST alone. torch 2.13
has no option for this: ``--master-addr`` and ``--rdzv-endpoint`` only name the address to
advertise, and the store listens on every interface (``*:PORT``, seen with ``ss -ltnp``).
"""

from __future__ import annotations

import sys


def _static_bound(params):
    from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import (
        StaticTCPRendezvous,
        create_rdzv_handler,
    )

    from areal_cli.transport.weights import bound_store

    class BoundStaticRendezvous(StaticTCPRendezvous):
        def get_backend(self) -> str:
            return "areal"

        def next_rendezvous(self):
            if self._store is None and self.rank == 0:
                self._store = bound_store(self.master_addr, self.master_port, self.world_size, self.timeout,
                                          multi_tenant=True)
            return super().next_rendezvous()

    h = create_rdzv_handler(params)  # validates the endpoint and rank
    return BoundStaticRendezvous(h.master_addr, h.master_port, int(h.rank), h.world_size, h.run_id,
                                 int(h.timeout.total_seconds()))


def main(argv: list[str]) -> None:
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry
    from torch.distributed.run import main as torchrun

    rendezvous_handler_registry.register("areal", _static_bound)
    torchrun(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
