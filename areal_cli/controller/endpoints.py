"""Where the controller's sockets bind, and how the other processes learn the addresses: a local run
binds ``launcher.port_base`` and up (or where the OS says) and writes ``endpoints.json``; under
Slurm the job's prepare step chose them. ``controller.ready`` is written last: the launcher starts
the others once it exists."""

from __future__ import annotations

import secrets

from areal_cli.durable import atomic_write
from areal_cli.rundir import RunDir
from areal_cli.transport.channels import Endpoints, make_endpoints


def planned_endpoints(cfg, rd: RunDir) -> Endpoints:
    """Where to bind. Under Slurm the job's prepare step chose them (``endpoints.json``); a local
    run binds ``launcher.port_base`` and up, or where the OS says (port_base=0)."""
    if cfg.launcher.name != "local":
        return Endpoints.load(rd.root)
    ep = make_endpoints(cfg.launcher.host, cfg.launcher.port_base)
    if not cfg.launcher.port_base:
        ep.work = ep.results = ep.batches = ep.control = ep.status = f"tcp://{cfg.launcher.host}:0"
    # the weight group's store: a file only the run's user can open, fresh for each start
    ep.weights_store = str(rd.store(f"weights-{secrets.token_hex(8)}"))
    return ep


def publish_endpoints(cfg, rd: RunDir, ep: Endpoints, bound: dict) -> None:
    """Write the addresses actually bound (a local run: the controller is the one writer of
    ``endpoints.json``), then ``controller.ready`` (the launcher starts the others once it
    exists)."""
    ep.work, ep.results, ep.batches = bound["work"], bound["results"], bound["batches"]
    ep.control, ep.status = bound["control"], bound["status"]
    if cfg.launcher.name == "local":
        ep.publish(rd.root)
    atomic_write(rd.controller_ready, "ok\n")
