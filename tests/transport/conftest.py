"""The run's CURVE keys and the controller's gatekeeper, for tests of real sockets on loopback."""

from __future__ import annotations

import logging

import pytest

from areal_cli.transport.auth import Gatekeeper, load_keys, make_keys

MIB = 1 << 20


@pytest.fixture
def keys(tmp_path):
    make_keys(tmp_path)
    return load_keys(tmp_path)


@pytest.fixture
def gate(keys):
    """One ZAP handler per ZeroMQ context (stopped after the test, so the next can start)."""
    g = Gatekeeper(keys, logging.getLogger("test.gate"))
    yield g
    g.stop()
