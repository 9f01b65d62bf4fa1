"""Cluster settings are checked at start; single-node mode (the default) needs no NATS: nothing a
broker process imports pulls nats in."""

from __future__ import annotations

import subprocess
import sys

import pytest

from stompbroker.settings import make_config


def test_single_node_mode_never_imports_nats():
    code = ("import sys\n"
            "import stompbroker.processes.supervisor, stompbroker.processes.dispatcher, stompbroker.cli\n"
            "from stompbroker.broker.core import Broker\n"
            "from stompbroker.settings import make_config\n"
            "from stompbroker.ipc.outbox import Outbox\n"
            "Broker(make_config(), [Outbox(0)])\n"
            "print(sorted(m for m in sys.modules if m == 'nats' or m.startswith('nats.')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_cluster_settings():
    config = make_config(cluster="nats://h1:4222, tls://h2:4222", node_id="n1")
    assert config.cluster == ["nats://h1:4222", "tls://h2:4222"]
    assert config.cluster_name == "stompbroker" and config.cluster_timeout_ms == 10000
    assert make_config().cluster == [] and make_config().cluster_placement_tags == []
    assert make_config(cluster_placement_tags="server0, az:b.1").cluster_placement_tags == ["server0", "az:b.1"]
    assert make_config(cluster_busy_bytes="0", cluster_busy_hold_ms="60000").cluster_busy_hold_ms == 60000
    for bad, words in [({"cluster": "h1:4222", "node_id": "n"}, "nats://"),
                       ({"cluster": "nats://h:1"}, "needs a node_id"),
                       ({"cluster": "nats://h:1", "node_id": "a.b"}, "node_id"),
                       ({"cluster_name": "a.b"}, "cluster_name"),
                       ({"cluster_timeout_ms": "0"}, "cluster_timeout_ms"),
                       ({"cluster_tls_cert": "c.pem"}, "cluster_tls_key"),
                       ({"cluster_placement_tags": "az 1"}, "cluster_placement_tags"),
                       ({"cluster_placement_tags": ",".join(f"t{i}" for i in range(65))}, "at most 64"),
                       ({"cluster_busy_bytes": "-1"}, "cluster_busy_bytes must be 0 to"),
                       ({"cluster_busy_hold_ms": "60001"}, "cluster_busy_hold_ms must be 0 to 60000")]:
        with pytest.raises(ValueError, match=words):
            make_config(**bad)


def test_cluster_secrets_are_never_shown():
    config = make_config(cluster="nats://h:1", node_id="n", cluster_token="s3cr3t-t", cluster_password="s3cr3t-p",
                         cluster_user="u")
    assert "s3cr3t" not in config.describe() and "cluster_user=u" in config.describe()
