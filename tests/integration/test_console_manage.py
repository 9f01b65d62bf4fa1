"""The console's management part (static/manage.js) clicked in headless Chromium against a real broker
with logins checked: the message browser's pages, purge (cancelled, then confirmed), the dead-letter
queue's "redrive all", move, closing a connection, and choosing another virtual host. Screenshots
are kept in the test's tmp dir."""

from __future__ import annotations

import base64
import http.client
import json
import os
import time
from urllib.parse import quote

import stomp

from stompbroker.security import hash_secret

CHROMIUM = "/usr/bin/chromium"


def depth(broker, destination: str, vhost: str = "/") -> int:
    conn = http.client.HTTPConnection(*broker.address, timeout=10)
    try:
        auth = "Basic " + base64.b64encode(b"root:toor").decode()
        conn.request("GET", f"/api/queues/{quote(vhost, safe='')}/{quote(destination, safe='')}/messages?count=1",
                     headers={"Authorization": auth})
        return json.loads(conn.getresponse().read())["depth"]
    finally:
        conn.close()


def until(predicate, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the console never showed it"
        time.sleep(0.1)


class Errors(stomp.ConnectionListener):
    def __init__(self):
        self.errors = []

    def on_error(self, frame):
        self.errors.append((frame.headers, frame.body))


def test_console_manages_queues_dead_letters_and_connections(start_broker, tmp_path):
    from playwright import sync_api as playwright
    assert os.path.exists(CHROMIUM), "the console test needs Debian's chromium (./build.sh test installs it)"
    (tmp_path / "passwd").write_text(f"root:{hash_secret('toor')}:admin\n")
    # (stomp.py sends the address it connects to as host: vhost_fallback puts those clients in /)
    b = start_broker("auth=passwd", f"passwd_file={tmp_path / 'passwd'}", "max_redeliveries=0",
                     f"audit_log={tmp_path / 'audit.log'}", "vhosts=eu", "vhost_fallback=true")
    producer = stomp.Connection([b.address])
    producer.connect("root", "toor", wait=True)
    for i in range(45):
        producer.send("/queue/work", f"job {i}", headers={"n": str(i)})
    nacked = []

    class Nack(stomp.ConnectionListener):
        def on_message(self, frame):
            nacked.append(frame.body)
            producer.nack(frame.headers["ack"], frame.headers["subscription"])
    producer.set_listener("nack", Nack())
    producer.subscribe("/queue/a", id="a", ack="client-individual")
    producer.subscribe("/queue/b", id="b", ack="client-individual")
    for destination in ("/queue/a", "/queue/a", "/queue/b"):
        producer.send(destination, "dead")
    until(lambda: len(nacked) == 3)
    producer.disconnect()
    victim_errors = Errors()
    victim = stomp.Connection([b.address])
    victim.set_listener("e", victim_errors)
    victim.connect("root", "toor", wait=True)
    victim.subscribe("/topic/victim", id="v")
    until(lambda: depth(b, "/queue/DLQ") == 3)

    errors = []
    shots = []

    def shot(page, name):
        path = tmp_path / f"console-manage-{len(shots) + 1}-{name}.png"
        page.screenshot(path=str(path), full_page=True)
        shots.append(path)

    with playwright.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1400},
                                    http_credentials={"username": "root", "password": "toor"})
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(f"http://{b.host}:{b.port}/")
            until(lambda: "/queue/work" in page.inner_text("#manage-queues tbody"))
            until(lambda: page.inner_text("#dlq-depth") == "3 waiting")  # (asked for after the table)
            work = page.locator("#manage-queues tbody tr", has_text="/queue/work")

            # the message browser, a page of 20 at a time
            work.locator("button", has_text="Browse").click()
            until(lambda: page.inner_text("#browser-range").strip() == "1–20 of 45")
            assert page.locator("#browser tbody tr").count() == 20
            assert "job 0" in page.inner_text("#browser tbody tr:first-child")
            page.click("#browser-next")
            until(lambda: page.inner_text("#browser-range").strip() == "21–40 of 45")
            page.click("#browser-next")
            until(lambda: page.inner_text("#browser-range").strip() == "41–45 of 45")
            assert page.is_disabled("#browser-next") and "job 44" in page.inner_text("#browser tbody")
            shot(page, "browser")

            # purge asks first: cancelled, nothing happens; confirmed, the queue is empty
            work.locator("button", has_text="Purge").click()
            assert page.is_visible("#confirm") and "45 waiting messages" in page.inner_text("#confirm-text")
            shot(page, "confirm-purge")
            page.click("#confirm-cancel")
            time.sleep(0.3)
            assert depth(b, "/queue/work") == 45
            work.locator("button", has_text="Purge").click()
            page.click("#confirm-ok")
            until(lambda: depth(b, "/queue/work") == 0)
            until(lambda: '"purged":45' in page.inner_text("#manage-status"))

            # the dead-letter queue: redrive all, each message back to where it died
            page.click("#dlq-redrive")
            page.click("#confirm-ok")
            until(lambda: depth(b, "/queue/DLQ") == 0)
            assert (depth(b, "/queue/a"), depth(b, "/queue/b")) == (2, 1)
            until(lambda: page.inner_text("#dlq-depth") == "0 waiting")
            shot(page, "redriven")

            # move, with the target typed into the dialog
            page.locator("#manage-queues tbody tr", has_text="/queue/a").locator("button", has_text="Move").click()
            page.fill("#confirm-input", "/queue/c")
            page.click("#confirm-ok")
            until(lambda: depth(b, "/queue/c") == 2)
            assert depth(b, "/queue/a") == 0

            # close a connection: its client gets an ERROR with the reason typed
            row = page.locator("#manage-connections tbody tr").filter(has_text="root").filter(
                has=page.locator("td:nth-child(4)", has_text="1"))
            row.locator("button", has_text="Close").click()
            page.fill("#confirm-input", "closed from the console")
            page.click("#confirm-ok")
            until(lambda: victim_errors.errors)
            (headers, body), = victim_errors.errors
            assert headers["message"] == "closed by an operator" and body == "closed from the console"
            shot(page, "closed")

            # another virtual host: chosen in the list, its own queues only
            eu = stomp.Connection([b.address], vhost="eu")
            eu.connect("root", "toor", wait=True)
            eu.send("/queue/eu-only", "x", receipt="r")
            until(lambda: depth(b, "/queue/eu-only", "eu") == 1)
            eu.disconnect()
            assert page.is_visible("#vhost")
            page.select_option("#vhost", "eu")
            until(lambda: "/queue/eu-only" in page.inner_text("#manage-queues tbody"))
            assert "/queue/c" not in page.inner_text("#manage-queues tbody")
            page.locator("#manage-queues tbody tr", has_text="/queue/eu-only").locator("button", has_text="Purge").click()
            page.click("#confirm-ok")
            until(lambda: depth(b, "/queue/eu-only", "eu") == 0)
            assert depth(b, "/queue/c") == 2  # the default vhost's queues are untouched
            shot(page, "vhost")
        finally:
            browser.close()
    assert not errors, errors
    assert all(p.stat().st_size > 20_000 for p in shots), shots
    lines = [json.loads(line) for line in (tmp_path / "audit.log").read_text().splitlines()]
    done = [(e["action"], e["target"]) for e in lines if e["status"] == 200 and e["action"] != "peek"]
    assert done == [("purge", "/queue/work"), ("move", "/queue/DLQ"), ("move", "/queue/a"),
                    ("close", done[3][1]), ("purge", "/queue/eu-only")], done
    assert [e["vhost"] for e in lines if e["status"] == 200 and e["action"] == "purge"] == ["/", "eu"]
    assert all(e["user"] == "root" for e in lines)
