"""Starting and stopping as an operator does: PID 1 in a container, failed starts, readiness, logs."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest
import stomp

from conftest import ROOT
from stompbroker.readiness import NotReady, wait_ready

PY = sys.executable


def env():
    return {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}


def wait_for(path: str, proc: subprocess.Popen, timeout: float = 20.0) -> dict:
    """The broker's ready_file record, once it serves."""
    try:
        return wait_ready(path, proc, timeout)
    except NotReady as exc:
        raise AssertionError(f"{path}: {exc}") from None


def send_and_receive(port: int) -> None:
    """A real STOMP session: CONNECT, SUBSCRIBE, SEND with a receipt, the MESSAGE back."""
    got, receipts = [], []

    class Listener(stomp.ConnectionListener):
        def on_message(self, frame):
            got.append(frame.body)

        def on_receipt(self, frame):
            receipts.append(frame.headers["receipt-id"])

    conn = stomp.Connection12([("127.0.0.1", port)])
    conn.set_listener("", Listener())
    conn.connect(wait=True)
    conn.subscribe("/queue/pid1", id="s")
    conn.send("/queue/pid1", "served as PID 1", receipt="r1")
    deadline = time.monotonic() + 10
    while (not got or not receipts) and time.monotonic() < deadline:
        time.sleep(0.02)
    seen = (list(receipts), list(got))  # before DISCONNECT, whose own receipt would join the list
    conn.disconnect()
    assert seen == (["r1"], ["served as PID 1"])


def unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"],
                          capture_output=True, timeout=10).returncode == 0


@pytest.mark.skipif(not unshare_works(), reason="needs unshare --pid (root or user namespaces)")
def test_supervisor_serves_as_pid_1_and_stops_cleanly_on_sigterm(tmp_path):
    """As a container's entrypoint the supervisor is PID 1 of its namespace."""
    log = open(tmp_path / "log", "wb")
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child",
                             PY, "-m", "stompbroker", "port=0", "processors=3", f"ready_file={tmp_path / 'ready'}"],
                            cwd=ROOT, env=env(), stdout=log, stderr=subprocess.STDOUT)
    try:
        port = wait_for(str(tmp_path / "ready"), proc)["port"]
        assert "MainProcess[1]" in (tmp_path / "log").read_text()  # the supervisor is PID 1
        send_and_receive(port)
        (supervisor,) = psutil.Process(proc.pid).children()
        roles = {c.pid for c in supervisor.children()}
        # an orphan of the namespace (as `docker exec sh -c 'cmd &'` leaves) is reparented to PID 1
        subprocess.run(["nsenter", "--target", str(supervisor.pid), "--pid", "--mount", "--",
                        "sh", "-c", "sleep 0.2 & exit 0"], check=True, timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            others = [c for c in supervisor.children() if c.pid not in roles]
            if not others:
                break
            time.sleep(0.1)
        assert not others, [(c.pid, c.status()) for c in others]  # reaped, no zombie left
        os.kill(supervisor.pid, signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        log.close()
    text = (tmp_path / "log").read_text()
    assert "stopped" in text and "Traceback" not in text and "did not start" not in text, text


def start_fails(*settings: str, timeout: float = 30.0) -> tuple[int, str, float]:
    began = time.monotonic()
    result = subprocess.run([PY, "-m", "stompbroker", "port=0", *settings], cwd=ROOT, env=env(),
                            capture_output=True, text=True, timeout=timeout)
    return result.returncode, result.stdout + result.stderr, time.monotonic() - began


@pytest.mark.parametrize("settings, name", [
    (("auth=passwd", "passwd_file=/nonexistent/stompbroker.passwd"), "/nonexistent/stompbroker.passwd"),
    (("acl_file=/nonexistent/acl",), "/nonexistent/acl"),
    (("ssl_port=0", "ssl_cert=/nonexistent/cert.pem", "ssl_key=/nonexistent/key.pem"), None),
])
def test_missing_file_stops_the_start_with_one_line_naming_it(settings, name):
    if name is None:  # ssl_port=0 is off: take a real port for the TLS listener
        settings = ("ssl_port=1",) + settings[1:]
        name = "/nonexistent/cert.pem"
    code, out, took = start_fails(*settings)
    assert code == 2, out
    assert took < 10
    lines = out.strip().splitlines()
    critical = [line for line in lines if "CRITICAL" in line]
    assert len(critical) == 1 and name in critical[0], out
    assert "listening" not in out and "Traceback" not in out, out


def test_a_child_that_dies_while_starting_stops_the_start(tmp_path):
    """Whatever kills a child at start, the supervisor exits non-zero instead of waiting for ever."""
    boom = ("import sys; from stompbroker.processes import dispatcher\n"
            "def fail(self, *a): raise RuntimeError('boom at start')\n"
            "dispatcher.Dispatcher.__init__ = fail\n"
            "from stompbroker.cli import main; sys.exit(main(['port=0', 'processors=3']))\n")
    began = time.monotonic()
    result = subprocess.run([PY, "-c", boom], cwd=ROOT, env=env(), capture_output=True, text=True, timeout=30)
    out = result.stdout + result.stderr
    assert result.returncode == 2, out
    assert time.monotonic() - began < 15
    assert "the dispatcher exited with status 1 while starting" in out
    assert "listening" not in out and "BufferError" not in out, out


def test_listening_is_announced_only_once_the_reader_serves(tmp_path):
    """The readiness line and file come after every child started, never before."""
    ready = tmp_path / "ready.json"
    log = open(tmp_path / "log", "wb")
    proc = subprocess.Popen([PY, "-m", "stompbroker", "port=0", "processors=3", f"ready_file={ready}"],
                            cwd=ROOT, env=env(), stdout=log, stderr=subprocess.STDOUT)
    try:
        info = wait_for(str(ready), proc)
        lines = (tmp_path / "log").read_text().splitlines()
        assert any(f"stompbroker listening on 127.0.0.1:{info['port']}" in line for line in lines)
        listening = min(i for i, line in enumerate(lines) if " listening on " in line)
        started = [i for i, line in enumerate(lines) if "started reader" in line]
        assert started and started[0] < listening, lines  # nothing says "listening" before that
        assert info["pid"] == proc.pid and info["host"] == "127.0.0.1"
        send_and_receive(info["port"])
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        log.close()
    assert not ready.exists()


def test_secrets_are_never_logged_and_settings_line_is_short(start_broker):
    b = start_broker("secret=hunter2", "TTL=5000", "log_level=DEBUG")
    log = b.log()
    assert "hunter2" not in log
    settings = next(line for line in log.splitlines() if " settings: " in line)
    assert "secret=***" in settings and "TTL=5000" in settings
    assert "max_header_line" not in settings  # defaults are left out of the INFO line


def test_json_log_format_is_one_object_per_line(start_broker):
    b = start_broker("log_format=json", "secret=hunter2")
    b.stop()
    lines = [line for line in b.log().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line parses
    assert {"ts", "level", "process", "pid", "logger", "message"} <= set(records[0])
    assert any(r["message"].startswith("stompbroker listening on 127.0.0.1:") for r in records)
    assert any(r["message"] == "stopped" for r in records)
    assert "hunter2" not in "\n".join(lines)


def test_tools_honour_the_brokers_port_and_host_variables(start_broker):
    b = start_broker()
    tool_env = {**env(), "STOMPBROKER_PORT": str(b.port), "STOMPBROKER_HOST": "0.0.0.0"}
    sink = subprocess.run([PY, "-m", "stompbroker.tools.sink", "--receipt", "/queue/env"], input=b"one\ntwo\n",
                          cwd=ROOT, env=tool_env, capture_output=True, timeout=30)
    assert sink.returncode == 0, sink.stderr
    drain = subprocess.run([PY, "-m", "stompbroker.tools.drain", "/queue/env"], cwd=ROOT, env=tool_env,
                           capture_output=True, text=True, timeout=30)
    assert drain.returncode == 0 and drain.stdout == "one\ntwo\n", drain.stderr
    bad = subprocess.run([PY, "-m", "stompbroker.tools.drain", "/queue/env"], cwd=ROOT,
                         env={**tool_env, "STOMPBROKER_PORT": "eighty"}, capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "$STOMPBROKER_PORT must be a port number" in bad.stderr


def test_passwd_without_a_terminal_reads_stdin_or_says_how(tmp_path):
    path = tmp_path / "passwd"
    cmd = [PY, "-m", "stompbroker.tools.passwd", str(path), "alice"]
    # start_new_session: no controlling terminal, as in a container or CI job
    empty = subprocess.run(cmd, cwd=ROOT, env=env(), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=30, start_new_session=True)
    assert empty.returncode == 1 and "Traceback" not in empty.stderr, empty.stderr
    assert len(empty.stderr.strip().splitlines()) == 1 and "pipe it in on stdin" in empty.stderr
    piped = subprocess.run(cmd, cwd=ROOT, env=env(), input="s3cret\n", capture_output=True, text=True,
                           timeout=30, start_new_session=True)
    assert piped.returncode == 0, piped.stderr
    assert path.read_text().startswith("alice:scrypt$")


def dockerfile_broker_stage() -> dict:
    """ENV, ENTRYPOINT, CMD and the HEALTHCHECK command of docker/Dockerfile's broker stage."""
    text = open(os.path.join(ROOT, "docker", "Dockerfile")).read()
    stage = text.split("FROM base AS broker", 1)[1].replace("\\\n", " ")
    out = {"env": {}}
    for line in stage.splitlines():
        word, _, rest = line.strip().partition(" ")
        if word == "ENV":
            out["env"].update(pair.split("=", 1) for pair in shlex.split(rest))
        elif word in ("ENTRYPOINT", "CMD"):
            out[word] = json.loads(rest)
        elif word == "HEALTHCHECK":
            out[word] = json.loads(rest.split(" CMD ", 1)[1])
    return out


@pytest.mark.skipif(not unshare_works(), reason="needs unshare --pid (root or user namespaces)")
def test_the_images_entrypoint_serves_as_pid_1_and_its_healthcheck_follows(tmp_path):
    """No Docker engine needed: the broker stage's ENTRYPOINT + CMD run as PID 1 with its ENV."""
    image = dockerfile_broker_stage()
    assert image["ENTRYPOINT"] == ["stompbroker"] and image["env"]["STOMPBROKER_PORT"] == "61613"
    bin_dir = os.path.dirname(PY)
    container_env = {**env(), **image["env"], "PATH": bin_dir + os.pathsep + os.environ["PATH"],
                     "STOMPBROKER_READY_FILE": str(tmp_path / "ready")}  # a private path for this test
    command = [os.path.join(bin_dir, image["ENTRYPOINT"][0]), *image["CMD"], "port=0"]  # port=0: no clash
    log = open(tmp_path / "log", "wb")
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", *command],
                            cwd=tmp_path, env=container_env, stdout=log, stderr=subprocess.STDOUT)

    def healthy() -> bool:
        return subprocess.run(image["HEALTHCHECK"], env=container_env, capture_output=True, timeout=10).returncode == 0

    try:
        info = wait_for(str(tmp_path / "ready"), proc)
        assert info["pid"] == 1 and info["host"] == "0.0.0.0"
        assert healthy()
        send_and_receive(info["port"])
        (supervisor,) = psutil.Process(proc.pid).children()
        os.kill(supervisor.pid, signal.SIGTERM)  # docker stop
        assert proc.wait(20) == 0
        assert not healthy()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        log.close()


def test_systemd_is_told_ready_only_once_serving_and_stopping_at_stop(tmp_path):
    """Type=notify in docker/stompbroker.service: READY=1 after the children started, STOPPING=1."""
    unit = open(os.path.join(ROOT, "docker", "stompbroker.service")).read()
    assert "Type=notify" in unit and "RestartPreventExitStatus=2" in unit
    address = str(tmp_path / "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(20)
    log = open(tmp_path / "log", "wb")
    proc = subprocess.Popen([PY, "-m", "stompbroker", "port=0", "processors=3"], cwd=ROOT,
                            env={**env(), "NOTIFY_SOCKET": address}, stdout=log, stderr=subprocess.STDOUT)
    try:
        ready = sock.recv(4096).decode()
        assert "READY=1" in ready and f"MAINPID={proc.pid}" in ready
        port = int(re.search(r"STATUS=listening on 127.0.0.1:(\d+)", ready).group(1))
        assert "started reader" in (tmp_path / "log").read_text()
        send_and_receive(port)
        proc.send_signal(signal.SIGTERM)
        assert sock.recv(4096).decode() == "STOPPING=1"
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        log.close()
        sock.close()


def test_sigterm_during_a_start_that_hangs_stops_the_broker(tmp_path):
    """A child stuck while starting (say, loading a huge store) does not make the broker deaf."""
    hang = ("import sys, time; from stompbroker.processes import dispatcher\n"
            "def stuck(self, *a): time.sleep(600)\n"
            "dispatcher.Dispatcher.__init__ = stuck\n"
            "from stompbroker.cli import main; sys.exit(main(['port=0', 'processors=3']))\n")
    log_path = tmp_path / "log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([PY, "-c", hang], cwd=ROOT, env=env(), stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 20
            while "started dispatcher" not in log_path.read_text() and time.monotonic() < deadline:
                time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(10) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
    assert "listening" not in log_path.read_text()


def test_a_broker_whose_frames_are_split_in_pure_python_says_so_at_start(start_broker):
    compiled = start_broker()
    assert "pure Python" not in compiled.log()  # (README's install compiles the splitter)
    pure = start_broker(env={"STOMPBROKER_PURE_PYTHON": "1"})
    send_and_receive(pure.port)  # and works as well
    warning = next(line for line in pure.log().splitlines() if "pure Python" in line)
    assert "WARNING" in warning and "STOMPBROKER_PURE_PYTHON is set" in warning
