"""The ``resources`` fixture: the shared parts of a broker (rings, statistics, the writers'
channels; processes/common.py ``Resources``) for making a reader, dispatcher or writer object in the
test's own process, no process started. Test modules take it with ``from inprocess import resources``.

A helper module, not tests/unit/conftest.py: tests/ has no packages, so pytest imports every
conftest.py as the module ``conftest``, and one in tests/unit would shadow tests/conftest.py, which
integration tests import (``from conftest import BrokerProcess``)."""

from __future__ import annotations

import signal
import socket

import pytest

from stompbroker.processes.common import Resources
from stompbroker.settings import make_config


@pytest.fixture
def resources():
    """(config, Resources) of a three-process broker, its listener bound to a free port."""
    config = make_config(processors=3, input_queue_bytes=1 << 22, output_queue_bytes=1 << 20,
                         max_frame_size=65536)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1024)
    res = Resources(config, listener)
    yield config, res
    signal.set_wakeup_fd(-1)  # a dispatcher installs its own for SIGHUP
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    res.close()
    listener.close()
