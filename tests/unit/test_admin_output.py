"""stompbroker-admin's human output for answers a test broker rarely gives (tools/admin.py), against
a stand-in for the HTTP API."""

from __future__ import annotations

import io

from stompbroker.tools import admin


class FakeApi(admin.Api):
    def __init__(self, answer: dict):
        super().__init__("http://127.0.0.1:1", None, None, "/")
        self.answer = answer

    def call(self, method, path, body=None, query=None):
        return self.answer


def human(argv: list[str], answer: dict) -> str:
    out = io.StringIO()
    admin.run(admin.parser().parse_args(argv), FakeApi(answer), out)
    return out.getvalue()


def test_a_cut_short_purge_or_move_says_to_run_it_again():
    assert "run it again" in human(["queue", "purge", "/queue/a"], {"purged": 0, "truncated": True})
    assert "run it again" not in human(["queue", "purge", "/queue/a"], {"purged": 3})
    text = human(["queue", "move", "/queue/a", "--to", "/queue/b"], {"moved": 0, "left": None, "truncated": True})
    assert text.startswith("moved 0 messages from /queue/a to /queue/b") and "run it again" in text
    assert human(["queue", "move", "/queue/a", "--to", "/queue/b"], {"moved": 2, "left": 1}) == \
        "moved 2 messages from /queue/a to /queue/b; 1 left\n"
