"""The one place engines and their weight senders are built: the rollout worker and the evaluator
call ``make_engine``, the trainer calls ``make_sender``; both look the engine up by its spec
(``engines.spec``).
"""

from __future__ import annotations

from collections.abc import Callable

from areal_cli.config.schema import RootConfig
from areal_cli.engines import spec
from areal_cli.engines.base import Engine, EngineSetup


def make_engine(setup: EngineSetup, doing: Callable[[str], None] | None = None) -> Engine:
    """The engine ``setup.engine.name`` built from ``setup``: its model loaded and, with a weight
    source, joined to trainer rank 0's weight group (which waits for every rollout worker).
    ``doing`` hears each stage ("loading the model", "joining the weight broadcast group").
    ValueError naming the engines there are for an unknown name, or how to install a missing
    package."""
    s = spec(setup.engine.name)
    s.require()
    return s.load().ENGINE(setup, doing or (lambda _what: None))


def make_sender(cfg: RootConfig, host: str, port: int, model, device, store: str = ""):
    """Trainer rank 0's end of ``cfg.engine.name``'s weight transfer (a ``WeightSenderBase``) to
    every rollout worker, hosting the group on ``host:port``; ``model`` is the trainer's policy (the
    parameters it will send), ``device`` the trainer's device, ``store`` the group's FileStore where
    the run has one (vLLM's own transfer keeps its TCPStore). Returns once every worker has
    joined."""
    return spec(cfg.engine.name).load().make_sender(cfg, host, port, model, device, store)
