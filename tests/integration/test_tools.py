"""End-to-end tests of stompbroker-tap, -sink and -drain, run as subprocesses against a real broker.

Every tool runs as ``python -m stompbroker.tools.<name>`` (same code as the console scripts), over raw
TCP and over WebSocket. tap runs with -v and the tests wait for its "subscribed to" line on stderr
before publishing, since a topic message sent before the subscription exists is dropped.
"""

from __future__ import annotations

import itertools
import os
import select
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import BrokerProcess

from stompbroker.tools import decode_escapes

PY = sys.executable
TIMEOUT = 20  # seconds any one tool run may take before the test fails
_names = itertools.count(1)


def unique(prefix: str) -> str:
    return f"{prefix}-{os.getpid()}-{next(_names)}"


def tool_cmd(name: str, conn: list[str], *args: str) -> list[str]:
    return [PY, "-m", f"stompbroker.tools.{name}", *conn, *args]


def run_tool(name: str, conn: list[str], *args: str, input: bytes = b"", timeout: float = TIMEOUT):
    return subprocess.run(tool_cmd(name, conn, *args), input=input, capture_output=True, timeout=timeout)


def wait_stderr(proc: subprocess.Popen, text: bytes, seen: bytes = b"", timeout: float = 15.0) -> bytes:
    """Read proc's stderr until ``text`` shows up; returns everything read (plus ``seen``)."""
    deadline = time.monotonic() + timeout
    fd = proc.stderr.fileno()
    while text not in seen:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            proc.kill()
            raise AssertionError(f"{text!r} did not show up on stderr; so far: {seen!r}")
        if select.select([fd], [], [], remaining)[0]:
            chunk = os.read(fd, 65536)
            if not chunk:
                proc.wait(5)
                raise AssertionError(f"exited ({proc.returncode}) before printing {text!r}: {seen!r}")
            seen += chunk
    return seen


class Tap:
    """A running tap; the constructor returns once its subscription is in place."""

    def __init__(self, conn: list[str], *args: str, procs: list | None = None):
        self.proc = subprocess.Popen(tool_cmd("tap", conn, "-v", *args), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        if procs is not None:
            procs.append(self.proc)
        self.err = wait_stderr(self.proc, b"subscribed to")

    def finish(self, timeout: float = TIMEOUT) -> tuple[bytes, bytes, int]:
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate(timeout=5)
            raise AssertionError(f"tap still running after {timeout} s; stdout {out[:300]!r} "
                                 f"stderr {(self.err + err)[-500:]!r}") from None
        return out, self.err + err, self.proc.returncode


@pytest.fixture
def procs():
    """Processes a test started; whatever is left running is killed afterwards."""
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


@pytest.fixture(params=["tcp", "ws"])
def conn(request, broker) -> list[str]:
    """Connection options for the module's broker, over TCP and over WebSocket."""
    if request.param == "tcp":
        return ["--host", broker.host, "--port", str(broker.port)]
    return ["--ws", f"ws://{broker.host}:{broker.port}/stomp"]


@pytest.fixture
def tcp(broker) -> list[str]:
    return ["--host", broker.host, "--port", str(broker.port)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_clean(stderr: bytes) -> None:
    assert b"Traceback" not in stderr, stderr.decode(errors="replace")


# --- tap and sink through pipes ------------------------------------------------------------------

def test_tap_receives_what_sink_sends(conn, procs):
    dest = unique("/topic/pipe")
    tap = Tap(conn, "-n", "3", "--timeout", "15", dest, procs=procs)
    sent = run_tool("sink", conn, dest, input=b"alpha\nbeta\ngamma\n")
    assert sent.returncode == 0, sent.stderr
    assert sent.stderr == b""
    out, err, rc = tap.finish()
    assert rc == 0, err
    assert out == b"alpha\nbeta\ngamma\n"
    assert_clean(err)


def test_tap_piped_into_sink_relays(tcp, procs):
    """tap /in | sink /out, as a shell pipeline would connect them; a second tap watches /out."""
    src, dst = unique("/topic/relay-in"), unique("/topic/relay-out")
    watcher = Tap(tcp, "-n", "3", "--timeout", "15", dst, procs=procs)
    relay_tap = subprocess.Popen(tool_cmd("tap", tcp, "-v", "-n", "3", "--timeout", "15", src),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    procs.append(relay_tap)
    relay_sink = subprocess.Popen(tool_cmd("sink", tcp, dst), stdin=relay_tap.stdout, stderr=subprocess.PIPE)
    procs.append(relay_sink)
    relay_tap.stdout.close()  # the pipe now belongs to the two children
    wait_stderr(relay_tap, b"subscribed to")
    published = run_tool("sink", tcp, src, input=b"one\ntwo\nthree\n")
    assert published.returncode == 0, published.stderr
    assert relay_tap.wait(TIMEOUT) == 0
    assert relay_sink.wait(TIMEOUT) == 0, relay_sink.stderr.read()
    out, err, rc = watcher.finish()
    assert (out, rc) == (b"one\ntwo\nthree\n", 0), err


@pytest.mark.parametrize("sink_args, data, count, tap_args, expected", [
    ([], b"a\nb\n", 2, [], b"a\nb\n"),                                   # newline both ways
    ([], b"a\nb", 2, ["-d", ","], b"a,b,"),                              # last line without newline
    ([], b"a\n\nb\n", 3, ["-d", "|"], b"a||b|"),                         # an empty line is an empty message
    (["-d", ","], b"x,y,z", 3, ["-d", ";"], b"x;y;z;"),                  # custom delimiter
    (["-d", "\\0"], b"one\0two words\0", 2, ["-d", "\\0"], b"one\0two words\0"),  # NUL (find -print0)
    (["-d", "\\t"], b"p\tq", 2, ["-d", "\\r\\n"], b"p\r\nq\r\n"),       # escapes, multi-byte delimiter
    (["-d", "::"], b"l1\nstill l1::l2", 2, ["-d", ""], b"l1\nstill l1l2"),  # no delimiter at all
], ids=["newline", "no-final-newline", "empty-line", "comma", "nul", "tab-crlf", "multibyte-none"])
def test_delimiters(tcp, procs, sink_args, data, count, tap_args, expected):
    dest = unique("/topic/delim")
    tap = Tap(tcp, "-n", str(count), "--timeout", "15", *tap_args, dest, procs=procs)
    sent = run_tool("sink", tcp, *sink_args, dest, input=data)
    assert sent.returncode == 0, sent.stderr
    out, err, rc = tap.finish()
    assert rc == 0, err
    assert out == expected


def test_tap_headers(conn, procs):
    dest = unique("/topic/headers")
    tap = Tap(conn, "--headers", "-n", "1", "--timeout", "15", dest, procs=procs)
    sent = run_tool("sink", conn, "-H", "x-color:red", "-H", "x-odd:a:b", "-H", "content-type:text/plain",
                    "--receipt", dest, input=b"the body\n")
    assert sent.returncode == 0, sent.stderr
    out, err, rc = tap.finish()
    assert rc == 0, err
    head, sep, rest = out.partition(b"\n\n")
    assert sep and rest == b"the body\n"  # body, then the default newline delimiter
    headers = dict(line.split(b":", 1) for line in head.split(b"\n"))
    assert headers[b"destination"] == dest.encode()
    assert headers[b"x-color"] == b"red"
    assert headers[b"x-odd"] == b"a\\cb"  # printed with STOMP 1.1 escaping: one header per line
    assert headers[b"content-type"] == b"text/plain"
    assert headers[b"content-length"] == b"8"
    assert b"message-id" in headers and b"subscription" in headers


def test_tap_stops_after_n(tcp, procs):
    dest = unique("/topic/count")
    tap = Tap(tcp, "-n", "2", dest, procs=procs)  # no timeout: -n alone must end it
    sent = run_tool("sink", tcp, dest, input=b"1\n2\n3\n4\n5\n")
    assert sent.returncode == 0, sent.stderr
    out, err, rc = tap.finish()
    assert (out, rc) == (b"1\n2\n", 0), err


def test_tap_timeout_is_silence(tcp, procs):
    """--timeout restarts at every message: messages 0.5 s apart keep a 1.5 s timeout from firing."""
    dest = unique("/topic/silence")
    sink = subprocess.Popen(tool_cmd("sink", tcp, "-v", dest), stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    procs.append(sink)
    wait_stderr(sink, b"connected to")  # connected first: only the delivery itself counts below
    tap = Tap(tcp, "--timeout", "1.5", dest, procs=procs)
    for i in range(5):  # 2.5 s in all: longer than the timeout
        sink.stdin.write(b"m%d\n" % i)
        sink.stdin.flush()
        time.sleep(0.5)
    sink.stdin.close()
    assert sink.wait(TIMEOUT) == 0, sink.stderr.read()
    out, err, rc = tap.finish()
    assert rc == 0, err
    assert out == b"".join(b"m%d\n" % i for i in range(5))


def test_tap_timeout_without_messages(tcp):
    dest = unique("/topic/nothing")
    start = time.monotonic()
    done = run_tool("tap", tcp, "--timeout", "0.5", dest)
    assert (done.returncode, done.stdout) == (0, b""), done.stderr
    # with -n, stopping before N messages is reported with status 3
    done = run_tool("tap", tcp, "-n", "1", "--timeout", "0.5", dest)
    assert (done.returncode, done.stdout) == (3, b""), done.stderr
    assert time.monotonic() - start < 10


def test_tap_max_time_is_total(tcp):
    start = time.monotonic()
    done = run_tool("tap", tcp, "--max-time", "0.8", "--timeout", "60", unique("/topic/total"))
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - start < 10  # the 60 s silence timeout did not apply


def test_tap_ctrl_c_exits_cleanly(conn, procs):
    tap = Tap(conn, unique("/topic/interrupt"), procs=procs)
    tap.proc.send_signal(signal.SIGINT)
    out, err, rc = tap.finish(timeout=10)
    assert rc == 130, err
    assert_clean(err)


def test_tap_broken_stdout_pipe(tcp, procs):
    """tap | head -1: when stdout goes away tap stops quietly (status 141, as after SIGPIPE)."""
    dest = unique("/topic/head")
    tap = Tap(tcp, dest, procs=procs)
    tap.proc.stdout.close()  # the reader of the pipe is gone
    sent = run_tool("sink", tcp, dest, input=b"x\n" * 50)
    assert sent.returncode == 0, sent.stderr
    rc = tap.proc.wait(TIMEOUT)
    err = tap.err + tap.proc.stderr.read()
    assert rc == 141, err
    assert_clean(err)


# --- sink ----------------------------------------------------------------------------------------

def test_sink_receipt(conn, procs):
    dest = unique("/topic/receipt")
    tap = Tap(conn, "-n", "3", "--timeout", "15", dest, procs=procs)
    sent = run_tool("sink", conn, "--receipt", "-v", dest, input=b"r1\nr2\nr3\n")
    assert sent.returncode == 0, sent.stderr
    assert b"sent 3 messages" in sent.stderr
    out, err, rc = tap.finish()
    assert (out, rc) == (b"r1\nr2\nr3\n", 0), err


def test_sink_whole_binary(conn, procs):
    data = bytes(range(256)) * 64 + b"\0\r\n\0" + "é ✓".encode() + b"\xff\xfe"
    dest = unique("/topic/binary")
    tap = Tap(conn, "-n", "1", "-d", "", "--timeout", "15", dest, procs=procs)
    sent = run_tool("sink", conn, "--whole", dest, input=data)
    assert sent.returncode == 0, sent.stderr
    out, err, rc = tap.finish()
    assert rc == 0, err
    assert out == data


def test_sink_whole_empty_input_sends_one_empty_message(tcp, procs):
    dest = unique("/topic/empty")
    tap = Tap(tcp, "-n", "1", "-d", "|", "--timeout", "15", dest, procs=procs)
    sent = run_tool("sink", tcp, "--whole", dest, input=b"")
    assert sent.returncode == 0, sent.stderr
    out, err, rc = tap.finish()
    assert (out, rc) == (b"|", 0), err


def test_sink_broker_not_reachable(conn):
    port = free_port()
    args = ["--port", str(port)] if "--port" in conn else ["--ws", f"ws://127.0.0.1:{port}/"]
    done = run_tool("sink", args, "/topic/a", input=b"x\n")
    assert done.returncode == 1
    assert b"cannot connect" in done.stderr and str(port).encode() in done.stderr, done.stderr
    assert_clean(done.stderr)


@pytest.mark.parametrize("receipt", [False, True], ids=["no-receipt", "receipt"])
def test_sink_refused_send_shows_error_message(conn, receipt):
    args = ["--receipt"] if receipt else []
    done = run_tool("sink", conn, *args, "/topic/*", input=b"x\n")
    assert done.returncode == 1
    # the ERROR frame's message header
    assert b"wildcard destination" in done.stderr, done.stderr
    assert done.stderr.count(b"\n") == 1  # one clear line
    assert_clean(done.stderr)


def test_sink_frame_too_large(conn):
    done = run_tool("sink", conn, "--whole", "/topic/big", input=b"z" * (5 * 1024 * 1024))
    assert done.returncode == 1
    # TCP: the broker's ERROR; WebSocket: the message is refused by the WebSocket layer (close 1009)
    assert b"frame too large" in done.stderr or b"1009" in done.stderr, done.stderr
    assert_clean(done.stderr)


def test_sink_broker_goes_away(start_broker, procs):
    broker = start_broker("processors=3")
    sink = subprocess.Popen(tool_cmd("sink", ["--port", str(broker.port)], "-v", "/topic/gone"),
                            stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    procs.append(sink)
    seen = wait_stderr(sink, b"connected to")
    sink.stdin.write(b"first\n")
    sink.stdin.flush()
    time.sleep(0.2)
    broker.stop(signal.SIGKILL)
    os.killpg(broker.proc.pid, signal.SIGKILL)  # the broker's children too: nobody holds the socket
    time.sleep(0.3)
    try:
        for _ in range(3):
            sink.stdin.write(b"more\n")
            sink.stdin.flush()
            time.sleep(0.1)
        sink.stdin.close()
    except BrokenPipeError:
        pass  # sink already gave up: fine
    assert sink.wait(TIMEOUT) == 1
    err = seen + sink.stderr.read()
    assert b"closed" in err or b"lost" in err, err
    assert_clean(err)


@pytest.mark.parametrize("transport", ["tcp", "ws"])
def test_sink_notices_broker_gone_while_waiting_for_input(start_broker, procs, transport):
    """`tail -f log | sink`: a broker that stops is noticed at once, not at the next line of input."""
    broker = start_broker("processors=3")
    conn = (["--port", str(broker.port)] if transport == "tcp"
            else ["--ws", f"ws://127.0.0.1:{broker.port}/"])
    sink = subprocess.Popen(tool_cmd("sink", conn, "-v", "/topic/idle"), stdin=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    procs.append(sink)
    seen = wait_stderr(sink, b"connected to")
    sink.stdin.write(b"first\n")
    sink.stdin.flush()
    time.sleep(0.2)
    broker.stop()  # SIGTERM: a graceful stop that closes every connection
    try:
        assert sink.wait(10) == 1  # stdin is still open and silent
    finally:
        sink.stdin.close()
    err = seen + sink.stderr.read()
    assert b"closed" in err, err
    assert_clean(err)


def test_sink_bad_header_is_a_usage_error(tcp):
    done = run_tool("sink", tcp, "-H", "content-length:3", "/topic/a")
    assert done.returncode == 2
    assert b"content-length" in done.stderr


# --- drain ---------------------------------------------------------------------------------------

def test_drain_empties_a_queue(conn):
    queue = unique("/queue/drain")
    lines = [b"job-%d" % i for i in range(7)]
    sent = run_tool("sink", conn, "--receipt", queue, input=b"\n".join(lines) + b"\n")
    assert sent.returncode == 0, sent.stderr
    done = run_tool("drain", conn, "--idle", "1", queue)
    assert done.returncode == 0, done.stderr
    assert b"drained 7 messages" in done.stderr, done.stderr
    assert sorted(done.stdout.splitlines()) == sorted(lines)
    again = run_tool("drain", conn, "--idle", "0.5", "--quiet", queue)
    assert again.returncode == 0, again.stderr
    assert b"drained 0 messages" in again.stderr
    assert again.stdout == b""


def test_drain_quiet_prints_nothing(tcp):
    queue = unique("/queue/quiet")
    sent = run_tool("sink", tcp, "--receipt", queue, input=b"a\nb\nc\n")
    assert sent.returncode == 0, sent.stderr
    done = run_tool("drain", tcp, "--quiet", "--idle", "1", queue)
    assert (done.returncode, done.stdout) == (0, b""), done.stderr
    assert b"drained 3 messages" in done.stderr


def test_tap_on_queue_leaves_what_it_did_not_print(tcp):
    """tap -n 1 on a queue acks only the message it printed: the others stay for the next consumer."""
    queue = unique("/queue/tap")
    sent = run_tool("sink", tcp, "--receipt", queue, input=b"q1\nq2\nq3\n")
    assert sent.returncode == 0, sent.stderr
    got = run_tool("tap", tcp, "-n", "1", "--timeout", "5", queue)
    assert got.returncode == 0, got.stderr
    assert got.stdout in (b"q1\n", b"q2\n", b"q3\n")
    done = run_tool("drain", tcp, "--quiet", "--idle", "1", queue)
    assert b"drained 2 messages" in done.stderr, done.stderr


# --- login and passcode --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def auth_broker(tmp_path_factory):
    """A broker checking logins against a passwd file with alice:sekret."""
    passwd = tmp_path_factory.mktemp("auth") / "passwd"
    made = subprocess.run([PY, "-m", "stompbroker.tools.passwd", str(passwd), "alice", "--password-stdin"],
                          input=b"sekret\n", capture_output=True, timeout=TIMEOUT)
    assert made.returncode == 0, f"cannot make a passwd file: {made.stderr!r}"
    b = BrokerProcess("processors=3", "auth=passwd", f"passwd_file={passwd}", "auth_fail_delay_ms=10")
    yield b
    b.close()


@pytest.mark.parametrize("transport", ["tcp", "ws"])
def test_login_passcode(auth_broker, procs, transport):
    conn = (["--port", str(auth_broker.port)] if transport == "tcp"
            else ["--ws", f"ws://127.0.0.1:{auth_broker.port}/"])
    dest = unique("/topic/auth")
    refused = run_tool("sink", conn, "--login", "alice", "--passcode", "wrong", dest, input=b"x\n")
    assert refused.returncode == 1
    assert b"ERROR from the broker" in refused.stderr, refused.stderr
    assert_clean(refused.stderr)
    tap = Tap(conn, "--login", "alice", "--passcode", "sekret", "-n", "1", "--timeout", "15", dest, procs=procs)
    # the passcode may also come from the environment (out of `ps`)
    sent = subprocess.run(tool_cmd("sink", conn, "--login", "alice", "--receipt", dest), input=b"hi\n",
                          capture_output=True, timeout=TIMEOUT, env={**os.environ, "STOMPBROKER_PASSCODE": "sekret"})
    assert sent.returncode == 0, sent.stderr
    out, err, rc = tap.finish()
    assert (out, rc) == (b"hi\n", 0), err


# --- command line --------------------------------------------------------------------------------

@pytest.mark.parametrize("name, words", [
    ("tap", [b"--timeout", b"--headers", b"-n N", b"silence", b"--ws"]),
    ("sink", [b"--whole", b"--receipt", b"NAME:VALUE", b"--ws"]),
    ("drain", [b"--quiet", b"--idle", b"drained N messages", b"--ws"]),
])
def test_help(name, words):
    done = subprocess.run([PY, "-m", f"stompbroker.tools.{name}", "--help"], capture_output=True, timeout=TIMEOUT)
    assert done.returncode == 0
    for word in words:
        assert word in done.stdout, word


def test_ws_and_port_conflict(broker):
    done = run_tool("tap", ["--ws", f"ws://127.0.0.1:{broker.port}/", "--port", "1"], "/topic/a")
    assert done.returncode == 2
    assert b"--ws cannot be combined" in done.stderr


@pytest.mark.parametrize("text, expected", [
    ("\\n", b"\n"), ("\\0", b"\0"), ("\\t", b"\t"), ("\\r\\n", b"\r\n"), ("\\\\", b"\\"),
    ("\\x1e", b"\x1e"), (",", b","), ("", b""), ("\\q", b"\\q"), ("é", "é".encode()), ("a\\", b"a\\"),
])
def test_decode_escapes(text, expected):
    assert decode_escapes(text) == expected
