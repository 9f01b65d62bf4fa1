"""Process titles: the one place that writes and reads ``stompbroker: ROLE``."""

from __future__ import annotations

import os

import psutil

from stompbroker.titles import process_role, role_of, title


def test_roles_read_back_from_titles_and_command_lines():
    assert role_of(title("writer-0")) == "writer-0"
    assert role_of(title("supervisor", "port=61613")) == "supervisor"
    assert role_of(["stompbroker: reader   "]) == "reader"  # psutil's list, padded
    assert role_of(["stompbroker:", "dispatcher"]) == "dispatcher"
    assert role_of(["python", "-m", "stompbroker"]) is None
    assert role_of("stompbroker: ") is None
    assert role_of("") is None


def test_a_process_that_is_not_ours_or_is_gone_has_no_role():
    assert process_role(psutil.Process(os.getpid())) is None

    class Gone:
        def cmdline(self):
            raise psutil.NoSuchProcess(1)

    assert process_role(Gone()) is None
