"""docker/compose.cluster.yaml and docker/haproxy.cfg, checked without a Docker engine: the broker
nodes' commands are valid settings, every node knows every NATS server, the NATS servers form one
JetStream cluster, haproxy balances over every node and its config passes `haproxy -c`."""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import subprocess

import pytest
import yaml

from stompbroker.cli import parse_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMPOSE = os.path.join(ROOT, "docker", "compose.cluster.yaml")
HAPROXY = os.path.join(ROOT, "docker", "haproxy.cfg")


def services() -> dict:
    with open(COMPOSE) as f:
        return yaml.safe_load(f)["services"]  # safe_load resolves the <<: merge keys


def brokers() -> dict:
    return {name: s for name, s in services().items() if s.get("image", "").startswith("stompbroker")}


def nats_servers() -> dict:
    return {name: s for name, s in services().items() if s.get("image", "").startswith("nats:")}


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_three_nats_servers_form_one_jetstream_cluster():
    nats = nats_servers()
    assert len(nats) == 3
    routes = {f"nats://{name}:6222" for name in nats}
    for name, s in nats.items():
        cmd = s["command"]
        assert "--jetstream" in cmd and flag(cmd, "--store_dir") == "/data"
        assert flag(cmd, "--server_name") == name  # JetStream clustering needs unique server names
        assert flag(cmd, "--cluster_name") == "stompbroker-nats"
        assert set(flag(cmd, "--routes").split(",")) == routes
        assert s["volumes"] == [f"{name}:/data"]  # its own store, kept across restarts
        assert "healthz" in " ".join(s["healthcheck"]["test"])


def test_broker_nodes_have_valid_cluster_settings_and_distinct_node_ids():
    nodes = brokers()
    assert len(nodes) == 3
    nats_urls = {f"nats://{name}:4222" for name in nats_servers()}
    configs = {name: parse_config(s["command"], environ={}) for name, s in nodes.items()}  # exits 2 if invalid
    for name, config in configs.items():
        assert set(config.cluster) == nats_urls, name
        assert config.node_id == name and config.host == "0.0.0.0" and config.port == 61613
        assert config.cluster_name == "stompbroker"
        assert {f"nats{i}" for i in (1, 2, 3)} <= set(nodes[name]["depends_on"])
        assert nodes[name]["stop_grace_period"]
    assert len({c.node_id for c in configs.values()}) == 3


def test_unknown_or_bad_settings_would_be_caught():
    with pytest.raises(SystemExit):  # the check above can fail: a misspelt setting stops the start
        parse_config(["host=0.0.0.0", "clustr=nats://nats1:4222"], environ={})


def test_haproxy_balances_over_every_node_with_health_checks():
    text = open(HAPROXY).read()
    servers = dict(re.findall(r"^\s*server (\S+) (\S+)", text, re.M))
    assert servers == {name: f"{name}:61613" for name in brokers()}
    assert re.search(r"^\s*mode tcp", text, re.M) and "uri /health_check" in text
    assert "on-marked-down shutdown-sessions" in text  # a dead node's clients are cut and reconnect
    lb = services()["lb"]
    assert "./haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro" in lb["volumes"]
    assert "61613:61613" in lb["ports"] and re.search(r"^\s*bind :61613$", text, re.M)


def test_nodes_believe_the_proxy_header_from_haproxy_alone():
    text = open(HAPROXY).read()
    assert re.search(r"^\s*default-server send-proxy-v2 ", text, re.M)
    with open(COMPOSE) as f:
        compose = yaml.safe_load(f)
    lb_address = services()["lb"]["networks"]["default"]["ipv4_address"]
    subnet = compose["networks"]["default"]["ipam"]["config"][0]["subnet"]
    assert ipaddress.ip_address(lb_address) in ipaddress.ip_network(subnet)
    for name, s in brokers().items():
        config = parse_config(s["command"], environ={})
        assert config.proxy_protocol and config.proxy_trusted == [lb_address], name


@pytest.mark.skipif(not shutil.which("haproxy"), reason="haproxy not installed (apt-get install haproxy)")
def test_haproxy_accepts_the_config():
    result = subprocess.run(["haproxy", "-c", "-f", HAPROXY], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ALERT" not in result.stdout + result.stderr
