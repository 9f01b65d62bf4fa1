"""stompbroker-admin end to end: run as ``python -m stompbroker.tools.admin`` (the console script's
code) against a real broker with logins checked; its output, --json and exit statuses."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import stomp

from stompbroker.security import hash_secret


def admin(broker, *args: str, password: str | None = "toor", user: str = "root", stdin: bytes = b""):
    env = {k: v for k, v in os.environ.items() if not k.startswith("STOMPBROKER_")}
    if password is not None:
        env["STOMPBROKER_PASSWORD"] = password
    command = [sys.executable, "-m", "stompbroker.tools.admin", "--url", f"http://127.0.0.1:{broker.port}",
               "--user", user, *args]
    done = subprocess.run(command, input=stdin, capture_output=True, timeout=30, env=env)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


def test_admin_tool_end_to_end(start_broker, tmp_path):
    (tmp_path / "passwd").write_text(f"root:{hash_secret('toor')}:admin\nuser:{hash_secret('user')}\n")
    b = start_broker("auth=passwd", f"passwd_file={tmp_path / 'passwd'}")
    producer = stomp.Connection([b.address])
    producer.connect("root", "toor", wait=True)
    for i in range(4):
        producer.send("/queue/jobs", f"job{i}", headers={"n": str(i)}, receipt=f"r{i}")
    producer.disconnect()

    status, out, _ = admin(b, "queue", "list", "--sort", "depth", "--reverse")
    assert status == 0 and out.splitlines()[0].split() == ["destination", "depth", "enqueued", "dequeued", "unacked",
                                                            "consumers"]
    assert out.splitlines()[1].split()[:2] == ["/queue/jobs", "4"]
    status, out, _ = admin(b, "--json", "queue", "peek", "/queue/jobs", "--count", "2")
    assert status == 0 and [m["payload"] for m in json.loads(out)["messages"]] == ["job0", "job1"]
    status, out, _ = admin(b, "queue", "move", "/queue/jobs", "--to", "/queue/later", "--selector", "n >= 2")
    assert (status, out.strip()) == (0, "moved 2 messages from /queue/jobs to /queue/later; 2 left")
    assert admin(b, "queue", "purge", "/queue/jobs")[1].strip() == "purged 2 messages from /queue/jobs"
    assert admin(b, "queue", "delete", "/queue/later")[1].strip() == "deleted /queue/later (2 messages)"
    status, out, _ = admin(b, "--json", "publish", "/queue/new", "-", "--header", "k=v", stdin=b"\xff\x00binary")
    assert status == 0 and json.loads(out) == {"published": True, "delivered": 0}
    status, out, _ = admin(b, "--json", "queue", "peek", "/queue/new")
    (message,) = json.loads(out)["messages"]
    assert message["headers"]["k"] == "v" and message["payload_encoding"] == "base64"
    assert message["payload"] == "/wBiaW5hcnk="  # (b"\xff\x00binary")
    assert admin(b, "vhost", "list")[1].split() == ["name", "/"]

    victim = stomp.Connection([b.address])
    victim.connect("root", "toor", wait=True)
    status, out, _ = admin(b, "--json", "connection", "list")
    (conn,) = [c for c in json.loads(out)["items"] if c["connected"]]
    status, out, _ = admin(b, "connection", "close", str(conn["id"]), "--reason", "bye")
    assert (status, out.strip()) == (0, f"closed connection {conn['id']}")

    # exit statuses: refused by the broker 1 (with its reason), a bad command line 2, nobody there 3
    status, _, err = admin(b, "connection", "close", str(conn["id"]))
    assert status == 1 and "404" in err
    status, _, err = admin(b, "queue", "purge", "/queue/jobs", user="user", password="user")
    assert status == 1 and "403" in err and "may not purge" in err
    status, _, err = admin(b, "queue", "purge", "/queue/jobs", password="wrong")
    assert status == 1 and "401" in err
    assert admin(b, "queue", "frobnicate")[0] == 2
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    status, _, err = admin(b, "--url", f"http://127.0.0.1:{port}", "queue", "list")
    assert status == 3 and "no answer" in err


def test_admin_tool_lists_and_cancels_scheduled_messages(start_broker, tmp_path):
    (tmp_path / "passwd").write_text(f"root:{hash_secret('toor')}:admin\n"
                                     f"bob:{hash_secret('bob')}:manage=/queue/jobs\n")
    b = start_broker("auth=passwd", f"passwd_file={tmp_path / 'passwd'}")
    producer = stomp.Connection([b.address])
    producer.connect("root", "toor", wait=True)
    for i, destination in enumerate(("/queue/jobs", "/queue/jobs", "/queue/jobs", "/queue/other")):
        producer.send(destination, f"later{i}", headers={"AMQ_SCHEDULED_DELAY": "600000"}, receipt=f"r{i}")
    producer.disconnect()

    status, out, _ = admin(b, "scheduled", "list")
    assert status == 0 and out.splitlines()[0].split() == ["id", "destination", "next", "left", "period", "repeat",
                                                            "cron", "bytes"]
    assert sorted(line.split()[1] for line in out.splitlines()[1:]) == ["/queue/jobs"] * 3 + ["/queue/other"]
    status, out, _ = admin(b, "--json", "scheduled", "list", "/queue/jobs")
    ids = [j["id"] for j in json.loads(out)["items"]]
    assert status == 0 and len(ids) == 3
    status, out, _ = admin(b, "scheduled", "cancel", "/queue/jobs", ids[0], user="bob", password="bob")
    assert (status, out.strip()) == (0, "cancelled 1 scheduled messages of /queue/jobs")
    status, _, err = admin(b, "scheduled", "cancel", "/queue/other", user="bob", password="bob")
    assert status == 1 and "403" in err
    status, _, err = admin(b, "scheduled", "cancel", "/queue/jobs", ids[0])
    assert status == 1 and "404" in err
    assert admin(b, "--json", "scheduled", "cancel", "/queue/jobs")[1:] == ('{\n  "cancelled": 2\n}\n', "")
    status, out, _ = admin(b, "--json", "scheduled", "list")
    assert [j["destination"] for j in json.loads(out)["items"]] == ["/queue/other"]
