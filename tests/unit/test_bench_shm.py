"""The idle scenario tells apart the PSS of the broker's shared-memory rings (pages its records
touched first) from the rest: the /dev/shm mappings of /proc/PID/smaps, nothing else."""

from __future__ import annotations

import os

from stompbroker.bench.procs import BrokerProcs, shm_pss_of
from stompbroker.ipc.ring import Ring

SMAPS = """\
55d0c0a00000-55d0c0b00000 rw-p 00000000 00:00 0                          [heap]
Size:               1024 kB
Pss:                 800 kB
VmFlags: rd wr mr mw me ac sd
7f0000000000-7f0000400000 rw-s 00000000 00:1a 4242                       /dev/shm/psm_1a2b3c (deleted)
Size:               4096 kB
Rss:                 120 kB
Pss:                  60 kB
Pss_Dirty:            60 kB
VmFlags: rd wr sh mr mw me ms sd
7f0000400000-7f0000401000 r--p 00000000 08:01 77                         /usr/lib/libc.so.6
Pss:                   4 kB
7f0000500000-7f0000600000 rw-s 00000000 00:1a 4243                       /dev/shm/psm_4d5e6f (deleted)
Pss:                   8 kB
"""


def test_only_the_shared_memory_mappings_count():
    assert shm_pss_of(SMAPS) == (60 + 8) * 1024


def test_a_ring_s_pages_count_once_touched():
    ring = Ring(1 << 22)
    try:
        procs = BrokerProcs(os.getpid(), "this process")
        before = procs.shm_pss()
        assert ring.try_write(b"x" * (1 << 20), 1)
        after = procs.shm_pss()
        assert after - before >= 1 << 20
    finally:
        ring.close()
