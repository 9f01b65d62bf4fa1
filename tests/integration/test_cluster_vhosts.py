"""Virtual hosts in cluster mode: two nodes on a real NATS JetStream cluster, both with
``vhosts=eu``. Topic, wildcard, ``#`` worker, queue and durable traffic of ``eu`` crosses the nodes and stays in
``eu``; the default vhost's clients, on the same names and with wildcards, see none of it."""

from __future__ import annotations

import socket

from tests.integration.test_cluster_topics import wait_interest
from tests.stompwire import Wire, drain, subscribe

NODE = ("vhosts=eu", "vhost_fallback=true", "max_redeliveries=0")  # (fallback: the DIAG helper sends host:localhost)


def join(node, vhost: str | None, login: str, **headers) -> Wire:
    """A raw STOMP connection to ``node`` in ``vhost`` (None: the default, ``/``)."""
    w = Wire(socket.create_connection(node.address, timeout=5))
    w.connect(login=login, host=vhost or "/", **headers)
    return w


def send(w: Wire, destination: str, body: str, **headers) -> None:
    w.frame("SEND", {"destination": destination, "receipt": body, **headers}, body.encode())
    command, got, _ = w.read(15)
    assert (command, got.get("receipt-id")) == ("RECEIPT", body), (command, got)


def messages(w: Wire, timeout: float = 1.0) -> list[tuple[str, str, str]]:
    """(subscription, destination, body) of each MESSAGE until ``timeout`` passes with none."""
    out = []
    for command, headers, body in drain(w, timeout):
        assert command == "MESSAGE", (command, headers, body)
        out.append((headers["subscription"], headers["destination"], body.decode()))
    return out


def pulled(w: Wire, first: float = 15.0) -> list[tuple[str, str, str]]:
    """``messages`` of a subscription whose consumer is bound in JetStream as it subscribes: the
    first may take seconds on a loaded machine (its bind, then its pull), the rest follow at once."""
    command, headers, body = w.read(first)
    assert command == "MESSAGE", (command, headers, body)
    return [(headers["subscription"], headers["destination"], body.decode()), *messages(w, 2)]


def test_a_vhosts_traffic_crosses_the_nodes_and_stays_in_its_vhost(start_nodes):
    n0, n1 = start_nodes(2, *NODE)
    eu_sub, root_sub = join(n1, "eu", "eu-sub"), join(n1, None, "root-sub")
    subscribe(eu_sub, "/topic/prices", "t")
    subscribe(eu_sub, "/topic/*", "w")
    subscribe(root_sub, "/topic/prices", "t")
    subscribe(root_sub, "/topic/*", "w")
    subscribe(root_sub, "*", "all")
    subscribe(eu_sub, "#jobs", "j")
    subscribe(root_sub, "#jobs", "j")
    wait_interest(n0, 7)  # eu: /topic/prices, /topic/*, #jobs; /: /topic/prices, /topic/*, *, #jobs
    eu_pub, root_pub = join(n0, "eu", "eu-pub"), join(n0, None, "root-pub")
    send(eu_pub, "/topic/prices", "eu-price")
    send(root_pub, "/topic/prices", "root-price")
    send(eu_pub, "#jobs", "eu-work")
    send(root_pub, "#jobs", "root-work")
    got_eu, got_root = messages(eu_sub), messages(root_sub)
    assert sorted(got_eu) == [("j", "#jobs", "eu-work"), ("t", "/topic/prices", "eu-price"),
                              ("w", "/topic/prices", "eu-price")], got_eu
    assert sorted(got_root) == [("all", "/topic/prices", "root-price"), ("j", "#jobs", "root-work"),
                                ("t", "/topic/prices", "root-price"), ("w", "/topic/prices", "root-price")], got_root

    # a persistent queue message: stored in JetStream on n0, delivered by n1, to eu's consumer only
    send(eu_pub, "/queue/jobs", "eu-job", persistent="true")
    send(root_pub, "/queue/jobs", "root-job", persistent="true")
    subscribe(root_sub, "/queue/jobs", "q")
    subscribe(eu_sub, "/queue/jobs", "q")
    assert pulled(eu_sub) == [("q", "/queue/jobs", "eu-job")]
    assert pulled(root_sub) == [("q", "/queue/jobs", "root-job")]

    # durable subscriptions of the same client-id and name in each vhost: two, each keeping its own
    # vhost's messages in JetStream while its client is away, and handing them over on another node
    durable = {"activemq.subscriptionName": "news", "ack": "client-individual"}
    away = [join(n1, vhost, f"reader-{vhost}", **{"client-id": "app"}) for vhost in ("eu", None)]
    for w in away:
        subscribe(w, "/topic/news", "d", **durable)
    for w in away:
        w.close()                                    # away: what comes now waits in JetStream
    send(root_pub, "/topic/news", "root-news", persistent="true")
    send(eu_pub, "/topic/news", "eu-news", persistent="true")
    for vhost, body in (("eu", "eu-news"), (None, "root-news")):
        back = join(n0, vhost, f"reader-{vhost}", **{"client-id": "app"})
        subscribe(back, "/topic/news", "d", **durable)
        assert [m[1:] for m in pulled(back)] == [("/topic/news", body)], vhost
        back.close()

    # a dead letter of eu goes to eu's dead-letter queue, named there as eu's clients name it
    eu_dl, root_dl = join(n1, "eu", "eu-dl"), join(n1, None, "root-dl")
    send(eu_pub, "/queue/bad", "eu-bad", persistent="true")
    eu_dl.frame("SUBSCRIBE", {"id": "b", "destination": "/queue/bad", "ack": "client-individual"})
    command, headers, body = eu_dl.read(10)
    assert (command, body) == ("MESSAGE", b"eu-bad"), (command, headers, body)
    eu_dl.frame("NACK", {"id": headers["ack"]})        # max_redeliveries=0: dead at once
    subscribe(root_dl, "/queue/DLQ", "dlq")
    eu_dl.frame("SUBSCRIBE", {"id": "dlq", "destination": "/queue/DLQ"})
    command, headers, body = eu_dl.read(10)
    assert (command, headers["destination"], body) == ("MESSAGE", "/queue/DLQ", b"eu-bad"), (command, headers)
    assert headers["original-destination"] == "/queue/bad", headers
    assert messages(root_dl, 1) == []
    for w in (eu_sub, root_sub, eu_pub, root_pub, eu_dl, root_dl):
        w.close()
