"""docker/haproxy.cfg run for real in front of brokers on loopback (no Docker): the node names
resolved to loopback ports, the rest of the configuration as shipped.

    with Haproxy([b1.port, b2.port, b3.port], tmp_path) as lb:   # every server UP by its health check
        lb.port, lb.stats() -> {server: (status, current sessions)}
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import urllib.request

from stompbroker.tools.natscluster import free_ports

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def local_config(server_ports: list[int], port: int, stats_port: int) -> str:
    """docker/haproxy.cfg with the servers b1, b2, b3 on the given loopback ports (Docker's DNS is
    not here) and its ports moved."""
    text = open(os.path.join(ROOT, "docker", "haproxy.cfg")).read()
    text = re.sub(r"resolvers docker\n(    .*\n)*", "", text).replace(" resolvers docker", "")
    text = text.replace("bind :61613", f"bind 127.0.0.1:{port}").replace("bind :8404", f"bind 127.0.0.1:{stats_port}")
    text = text.replace("log stdout format raw local0", "").replace("maxconn 100000", "maxconn 1000")  # FD limit here
    for i, server_port in enumerate(server_ports, 1):
        text = text.replace(f"server b{i} b{i}:61613", f"server b{i} 127.0.0.1:{server_port}")
    assert "b1:61613" not in text
    return text


class Haproxy:
    def __init__(self, server_ports: list[int], directory, edit=lambda text: text):
        self.port, self.stats_port = free_ports(2)
        path = os.path.join(str(directory), "haproxy.cfg")
        with open(path, "w") as f:
            f.write(edit(local_config(server_ports, self.port, self.stats_port)))
        self.proc = subprocess.Popen(["haproxy", "-f", path], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.servers = {f"b{i}" for i in range(1, len(server_ports) + 1)}

    def __enter__(self) -> "Haproxy":
        try:
            self.wait_up()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def wait_up(self, timeout: float = 20.0) -> None:
        """Until every server is UP by its GET /health_check."""
        deadline = time.monotonic() + timeout
        st = {}
        while True:
            try:
                st = self.stats()
                if set(st) == self.servers and all(s == "UP" for s, _ in st.values()):
                    return
            except OSError:
                pass
            assert self.proc.poll() is None, self.proc.stdout.read().decode()
            assert time.monotonic() < deadline, st
            time.sleep(0.2)

    def stats(self) -> dict[str, tuple[str, int]]:
        """server -> (status, current sessions), from haproxy's CSV stats."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.stats_port}/;csv", timeout=2) as r:
            rows = [line.split(",") for line in r.read().decode().splitlines()]
        col = {name.lstrip("# "): i for i, name in enumerate(rows[0])}
        return {row[col["svname"]]: (row[col["status"]], int(row[col["scur"]] or 0))
                for row in rows[1:] if len(row) > 5 and row[col["pxname"]] == "brokers"
                and row[col["svname"]] not in ("BACKEND", "FRONTEND")}

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
        self.proc.stdout.close()
