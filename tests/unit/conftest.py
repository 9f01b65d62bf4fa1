"""Fixtures shared by the unit tests that drive a process loop in-process."""

from __future__ import annotations

import signal
import socket

import pytest

from stompbroker.processes.common import Resources
from stompbroker.settings import make_config


@pytest.fixture
def resources():
    """(config, Resources) for a reader, dispatcher or writer built in this process: small rings,
    a listening loopback socket, and the signal handling a dispatcher installs put back after."""
    config = make_config(processors=3, input_queue_bytes=1 << 22, output_queue_bytes=1 << 20,
                         max_frame_size=65536)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1024)
    res = Resources(config, listener)
    yield config, res
    signal.set_wakeup_fd(-1)  # the dispatcher installs its own for SIGHUP
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    res.close()
    listener.close()
