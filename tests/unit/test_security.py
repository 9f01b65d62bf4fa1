"""Unit tests for stompbroker.security (passwd file, permissions, tokens) and stompbroker-passwd."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import stat
import subprocess
import sys
import time

import pytest

from stompbroker.security import (PasswdError, Permissions, ReplayGuard, Users, hash_secret, load, make_token,
                                  parse_acl, parse_hash, parse_inline, parse_passwd, parse_token_login,
                                  pattern_covers, pattern_matches, token_passcode, verify_secret, verify_token)
from stompbroker.security import passwd as passwd_mod
from stompbroker.tools import passwd as tool

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# One hash per secret for the whole module: each costs a scrypt.
HASHES: dict[str, str] = {}


def hashed(secret: str) -> str:
    if secret not in HASHES:
        HASHES[secret] = hash_secret(secret)
    return HASHES[secret]


def users(text: str, acl: str | None = None, **options) -> Users:
    entries, inline = parse_passwd(text, "passwd")
    return Users(entries, inline, parse_acl(acl, "acl") if acl is not None else None, path="passwd", **options)


# --- parsing ------------------------------------------------------------------------------------

def test_comments_blank_lines_and_whitespace():
    text = ("# the users\n"
            "\n"
            "   \t\n"
            f"  alice : {hashed('a-secret')}  \n"
            "    # indented comment\n"
            "bob:plain-bob\r\n"
            "carol:  spaced secret  \n")
    u = users(text)
    assert u.logins == {"alice", "bob", "carol"}
    assert len(u) == 3 and "alice" in u and "nobody" not in u
    assert u.verify("alice", "a-secret")
    assert u.verify("bob", "plain-bob")
    assert u.verify("carol", "spaced secret")  # only the surrounding whitespace is trimmed
    assert not u.verify("carol", "  spaced secret  ")


@pytest.mark.parametrize("text,line,reason", [
    ("alice\n", 1, "no ':'"),
    ("# ok\n\nalice:x\nbob\n", 4, "no ':'"),
    (":secret\n", 1, "empty login"),
    ("alice:\n", 1, "empty secret"),
    ("alice:   :read=/a\n", 1, "empty secret"),
    ("al ice:x\n", 1, "whitespace"),
    ("a:x\nb:y\na:z\n", 3, "already defined on line 1"),
    ("alice:scrypt$8192$8$1$AAAA\n", 1, "scrypt$N$r$p$SALT$HASH"),
    ("alice:scrypt$8191$8$1$AAAAAAAAAAA=$AAAAAAAAAAAAAAAAAAAAAA==\n", 1, "power of 2"),
    ("alice:scrypt$1048576$64$1$AAAAAAAAAAA=$AAAAAAAAAAAAAAAAAAAAAA==\n", 1, "exceeds"),
    ("alice:scrypt$8192$8$99$AAAAAAAAAAA=$AAAAAAAAAAAAAAAAAAAAAA==\n", 1, "p exceeds"),
    ("alice:scrypt$8192$8$x$AAAAAAAAAAA=$AAAAAAAAAAAAAAAAAAAAAA==\n", 1, "decimal"),
    ("alice:scrypt$8192$8$1$!!!$AAAAAAAAAAAAAAAAAAAAAA==\n", 1, "salt is not valid base64"),
    ("alice:scrypt$8192$8$1$AAAA$AAAAAAAAAAAAAAAAAAAAAA==\n", 1, "salt must be"),
    ("alice:scrypt$8192$8$1$AAAAAAAAAAA=$AAAA\n", 1, "hash must be"),
    ("alice:x:bogus=/a\n", 1, "unknown permission"),
    ("alice:x:read\n", 1, "needs '='"),
    ("alice:x:read=/a,,/b\n", 1, "empty destination pattern"),
    ("alice:x:read=/a b\n", 1, "whitespace"),
    ("alice:x:admin=yes\n", 1, "no value"),
])
def test_malformed_lines(text, line, reason):
    with pytest.raises(PasswdError) as info:
        parse_passwd(text, "/etc/passwd-test")
    err = info.value
    assert err.line == line
    assert reason in err.reason
    assert str(err).startswith(f"/etc/passwd-test:{line}: ")


def test_load_reports_bad_utf8_line(tmp_path):
    path = tmp_path / "passwd"
    path.write_bytes(b"a:x\nb:y\nc:\xff\xfe\n")
    with pytest.raises(PasswdError) as info:
        load(str(path))
    assert info.value.line == 3 and "UTF-8" in info.value.reason


def test_load_files_and_warnings(tmp_path):
    path = tmp_path / "passwd"
    path.write_text(f"alice:{hashed('s1')}\nbob:old-plain\n")
    os.chmod(path, 0o644)
    acl = tmp_path / "acl"
    acl.write_text("alice read /topic/*\n")
    u = load(str(path), str(acl))
    assert u.plain == {"bob"}
    warnings = "\n".join(u.warnings())
    assert "plain-text" in warnings and "bob" in warnings and "alice" not in warnings.split("plain-text")[1]
    assert "0644" in warnings
    assert u.can_read("alice", "/topic/x") and not u.can_write("alice", "/topic/x")
    os.chmod(path, 0o600)
    assert not any("mode" in w for w in load(str(path)).warnings())
    with pytest.raises(OSError):
        load(str(tmp_path / "missing"))


def test_no_passwd_file_acl_only(tmp_path):
    acl = tmp_path / "acl"
    acl.write_text("tok read /topic/t/*\n")
    u = load(None, str(acl))
    assert len(u) == 0 and not u.verify("tok", "x")
    assert u.can_read("tok", "/topic/t/1") and not u.can_read("tok", "/topic/u")
    assert u.can_read("anyone", "/x")


# --- verification -------------------------------------------------------------------------------

def test_hash_format_and_verify_secret():
    stored = hash_secret("pässwörd")
    n, r, p, salt, digest = parse_hash(stored)
    assert stored.startswith(f"scrypt${n}${r}${p}$")
    assert (n, r, p) == (passwd_mod.SCRYPT_N, passwd_mod.SCRYPT_R, passwd_mod.SCRYPT_P)
    assert len(salt) == passwd_mod.SALT_BYTES and len(digest) == passwd_mod.HASH_BYTES
    assert digest == hashlib.scrypt("pässwörd".encode(), salt=salt, n=n, r=r, p=p, dklen=len(digest))
    assert verify_secret(stored, "pässwörd") and not verify_secret(stored, "passwörd")
    assert hash_secret("same") != hash_secret("same")  # salted
    with pytest.raises(ValueError):
        hash_secret("")


def test_verify_right_wrong_unknown():
    u = users(f"alice:{hashed('right')}\n")
    assert u.verify("alice", "right")
    assert not u.verify("alice", "wrong")
    assert not u.verify("alice", "")
    assert not u.verify("alice", None)
    assert not u.verify("mallory", "right")
    assert not u.verify(None, "right")
    assert not u.verify("", "")


def test_verify_is_fast_enough_and_uniform():
    """Well under 50 ms per attempt, and an unknown login costs as much as a wrong passcode."""
    u = users(f"alice:{hashed('right')}\nbob:plain\n", cache_size=0)

    def cost(login, passcode):
        # CPU time of this thread (scrypt runs here): not inflated by other processes on the machine
        best = float("inf")
        for _ in range(3):
            t = time.thread_time()
            u.verify(login, passcode)
            best = min(best, time.thread_time() - t)
        return best

    wrong, unknown, plain = cost("alice", "wrong"), cost("nobody", "wrong"), cost("bob", "wrong")
    assert wrong < 0.05
    # Each does one scrypt of the same parameters: within a factor 2 of each other (a skipped
    # scrypt would be ~1000x faster).
    for a, b in ((wrong, unknown), (wrong, plain)):
        assert max(a, b) / min(a, b) < 2.0, (wrong, unknown, plain)


def test_verify_cache_only_successes():
    now = [1000.0]
    u = users(f"alice:{hashed('right')}\n", cache_size=2, cache_ttl=10, clock=lambda: now[0])
    calls = []
    real = passwd_mod._scrypt

    def counting(*args):
        calls.append(1)
        return real(*args)

    passwd_mod._scrypt = counting
    try:
        assert u.verify("alice", "right") and len(calls) == 1
        assert u.verify("alice", "right") and len(calls) == 1       # cached
        assert not u.verify("alice", "wrong") and len(calls) == 2
        assert not u.verify("alice", "wrong") and len(calls) == 3   # failures never cached
        now[0] += 11
        assert u.verify("alice", "right") and len(calls) == 4       # expired
    finally:
        passwd_mod._scrypt = real


def test_plain_text_compatibility_flagged():
    u = users("legacy:open sesame\n")
    assert u.plain == {"legacy"}
    assert u.verify("legacy", "open sesame")
    assert not u.verify("legacy", "open")
    assert any("plain-text" in w and "legacy" in w for w in u.warnings())


def test_outdated_parameters_flagged():
    old = hash_secret("x", n=1024, r=8, p=1)
    u = users(f"old:{old}\n")
    assert u.verify("old", "x")
    assert u.outdated == {"old"}
    assert any("old" in w and "scrypt parameters" in w for w in u.warnings())


# --- permissions --------------------------------------------------------------------------------

def test_pattern_rules():
    assert pattern_matches("/topic/a", "/topic/a")
    assert not pattern_matches("/topic/a", "/topic/ab")
    assert pattern_matches("/topic/*", "/topic/a/b")
    assert pattern_matches("/topic/*", "/topic/")
    assert not pattern_matches("/topic/*", "/topic")
    assert pattern_matches("*", "anything")
    assert pattern_matches("/a*xyz", "/abc")  # text after the first * is ignored (broker rule)
    # wildcard subscriptions need a rule covering all they can match
    assert pattern_covers("/topic/*", "/topic/a/*")
    assert pattern_covers("/topic/*", "/topic/*")
    assert not pattern_covers("/topic/a", "/topic/*")
    assert not pattern_covers("/topic/a/*", "/topic/*")
    assert not pattern_covers("/topic/*", "*")
    assert pattern_covers("*", "*")


def test_no_rules_means_everything():
    u = users("free:x\nboss:y:admin\n")
    for login in ("free", "boss", "unknown", "", None):
        assert u.can_read(login, "/queue/anything") and u.can_write(login, "/topic/x")
        assert u.can_read(login, "*")
    assert u.is_admin("boss") and not u.is_admin("free") and not u.is_admin("unknown")


def test_inline_rules_restrict():
    u = users("alice:x:read=/topic/*,/queue/a;write=/queue/*;admin\n"
              "writer:x:write=/queue/in\n"
              "reader:x: read = /topic/news ; \n")
    assert u.can_read("alice", "/topic/x") and u.can_read("alice", "/queue/a") and u.can_read("alice", "/topic/*")
    assert not u.can_read("alice", "/queue/b") and not u.can_read("alice", "*")
    assert u.can_write("alice", "/queue/b") and not u.can_write("alice", "/topic/x")
    assert u.is_admin("alice")
    # only write rules: cannot read anything
    assert u.can_write("writer", "/queue/in") and not u.can_write("writer", "/queue/out")
    assert not u.can_read("writer", "/queue/in")
    # only read rules: cannot write anything
    assert u.can_read("reader", "/topic/news") and not u.can_read("reader", "/topic/news2")
    assert not u.can_write("reader", "/topic/news") and not u.is_admin("reader")


def test_acl_file_and_default_rules():
    acl = ("# rules\n"
           "alice read /topic/a/*, /topic/b\n"
           "alice write #jobs\n"
           "bob admin\n"
           "  *   read /topic/public/*  \n")
    u = users("alice:x\nbob:y\ncarol:z:write=/queue/c\n", acl)
    assert u.can_read("alice", "/topic/a/1") and u.can_read("alice", "/topic/b")
    assert not u.can_read("alice", "/topic/public/x")  # own rules: the default does not apply
    assert u.can_write("alice", "#jobs") and not u.can_write("alice", "#other")
    # bob has only admin: the default read/write rules apply, admin kept
    assert u.is_admin("bob") and u.can_read("bob", "/topic/public/x") and not u.can_read("bob", "/topic/a/1")
    assert not u.can_write("bob", "/topic/public/x")
    # inline rules count as own rules
    assert u.can_write("carol", "/queue/c") and not u.can_read("carol", "/topic/public/x")
    # unknown and anonymous logins get the default
    assert u.can_read("token-user", "/topic/public/1") and not u.can_write("token-user", "/topic/public/1")
    assert u.can_read("", "/topic/public/1") and not u.can_read(None, "/topic/private")


def test_inline_and_acl_rules_add_up():
    u = users("alice:x:read=/topic/a\n", "alice read /topic/b\nalice write /queue/q\n")
    p = u.permissions("alice")
    assert p.read == ("/topic/a", "/topic/b") and p.write == ("/queue/q",) and not p.admin
    assert p.to_inline() == "read=/topic/a,/topic/b;write=/queue/q"


@pytest.mark.parametrize("text,line,reason", [
    ("alice\n", 1, "expected"),
    ("alice read\n", 1, "needs destination patterns"),
    ("# c\nalice admin /x\n", 2, "takes no patterns"),
    ("alice delete /x\n", 1, "unknown permission"),
    ("* admin\n", 1, "every login"),
    ("ali:ce read /x\n", 1, "contains ':'"),
    ("alice read /a,,/b\n", 1, "empty destination pattern"),
])
def test_malformed_acl(text, line, reason):
    with pytest.raises(PasswdError) as info:
        parse_acl(text, "acl")
    assert info.value.line == line and reason in info.value.reason


def test_parse_inline_roundtrip():
    p = parse_inline("admin;read=/a,/b*;read=/c;write=*")
    assert p == Permissions(("/a", "/b*", "/c"), ("*",), True)
    assert parse_inline(p.to_inline()) == p
    assert parse_inline("") == Permissions()


# --- tokens -------------------------------------------------------------------------------------

SECRET = "0123456789abcdef-shared-secret"
NOW = 1_700_000_000.0


def test_token_matches_xtomp_construction():
    login = "alice 1700000000 r4nd0m"
    expected = base64.b64encode(hashlib.sha1((login + SECRET).encode()).digest()).decode()
    assert token_passcode(login, SECRET) == expected
    assert verify_token(login, expected, SECRET, 60, NOW) == "alice"


def test_token_fresh_expired_future():
    login, passcode = make_token("alice", SECRET, NOW)
    assert parse_token_login(login)[:2] == ("alice", int(NOW))
    assert verify_token(login, passcode, SECRET, 60, NOW) == "alice"
    assert verify_token(login, passcode, SECRET, 60, NOW + 60) == "alice"      # at the limit
    assert verify_token(login, passcode, SECRET, 60, NOW + 61) is None         # expired
    assert verify_token(login, passcode, SECRET, 60, NOW - 10) == "alice"      # small skew
    assert verify_token(login, passcode, SECRET, 60, NOW - 31) is None         # too far ahead
    assert verify_token(login, passcode, SECRET, 60, NOW - 100, skew=120) == "alice"


def test_token_wrong_secret_or_tampered():
    login, passcode = make_token("alice", SECRET, NOW)
    assert verify_token(login, passcode, SECRET + "x", 60, NOW) is None
    assert verify_token(login.replace("alice", "admin"), passcode, SECRET, 60, NOW) is None
    assert verify_token(login, passcode.rstrip("="), SECRET, 60, NOW) is None  # canonical form only
    assert verify_token(login, "", SECRET, 60, NOW) is None
    assert verify_token(login, None, SECRET, 60, NOW) is None
    assert verify_token(login, "é" * 28, SECRET, 60, NOW) is None  # non-ASCII passcode: no exception


@pytest.mark.parametrize("login", [
    "alice", "alice 1700000000", "alice 1700000000 ", " 1700000000 r", "alice -5 r", "alice +5 r",
    "alice 17e8 r", "alice 1234567890123 r", "alice １２３ r", "",
])
def test_token_malformed_login(login):
    # even with a correct MAC over the malformed login, it is refused
    assert parse_token_login(login) is None
    assert verify_token(login, token_passcode(login, SECRET), SECRET, 10 ** 12, NOW) is None


def test_token_random_part_may_hold_spaces():
    login = "bob 1700000000 some random text"
    assert verify_token(login, token_passcode(login, SECRET), SECRET, 60, NOW) == "bob"


def test_token_hmac_mode():
    login, passcode = make_token("alice", SECRET, NOW, mode="hmac")
    import hmac as _hmac
    assert passcode == base64.b64encode(_hmac.new(SECRET.encode(), login.encode(), hashlib.sha256).digest()).decode()
    assert verify_token(login, passcode, SECRET, 60, NOW, mode="hmac") == "alice"
    assert verify_token(login, passcode, SECRET, 60, NOW, mode="sha1") is None
    sha_login, sha_passcode = make_token("alice", SECRET, NOW)
    assert verify_token(sha_login, sha_passcode, SECRET, 60, NOW, mode="hmac") is None
    with pytest.raises(ValueError):
        verify_token(login, passcode, SECRET, 60, NOW, mode="md5")
    with pytest.raises(ValueError):
        verify_token(login, passcode, "", 60, NOW)


def test_replay_guard():
    guard = ReplayGuard(max_entries=2)
    assert guard.first_use("a 1 x", expires=10, now=0)
    assert not guard.first_use("a 1 x", expires=10, now=5)
    assert guard.first_use("a 1 x", expires=20, now=10)     # expired entry forgotten
    assert guard.first_use("b 1 x", expires=30, now=11)
    assert guard.first_use("c 1 x", expires=40, now=12)     # full: the first to expire goes
    assert len(guard) == 2
    assert not guard.first_use("c 1 x", expires=40, now=13)


# --- stompbroker-passwd -------------------------------------------------------------------------

def run_tool(monkeypatch, argv, stdin=None, prompts=None):
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    if prompts is not None:
        answers = iter(prompts)
        monkeypatch.setattr(tool.getpass, "getpass", lambda prompt="": next(answers))
        monkeypatch.setattr(tool, "has_terminal", lambda: True)
    return tool.main(argv)


def test_passwd_command_end_to_end(tmp_path, monkeypatch, capsys):
    path = tmp_path / "passwd"
    original = ("# stompbroker users\n"
                "\n"
                "legacy:plain-one\n"
                "alice:old-plain:read=/topic/*;admin\n"
                "  # trailing comment\n")
    path.write_text(original)
    os.chmod(path, 0o644)

    # add a new user (secret from stdin)
    assert run_tool(monkeypatch, [str(path), "bob", "--password-stdin"], stdin="bob-secret\n") == 0
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    text = path.read_text()
    assert text.startswith(original) and text.count("\n") == original.count("\n") + 1
    assert load(str(path)).verify("bob", "bob-secret")

    # replace alice's secret (prompted twice): permissions and position kept
    assert run_tool(monkeypatch, [str(path), "alice"], prompts=["new-alice", "new-alice"]) == 0
    lines = path.read_text().splitlines()
    assert lines[0] == "# stompbroker users" and lines[2] == "legacy:plain-one"
    assert lines[3].startswith("alice:scrypt$") and lines[3].endswith(":read=/topic/*;admin")
    u = load(str(path))
    assert u.verify("alice", "new-alice") and not u.verify("alice", "old-plain")
    assert u.is_admin("alice") and u.can_read("alice", "/topic/x") and not u.can_write("alice", "/topic/x")
    assert u.plain == {"legacy"}

    # replace the permissions
    assert run_tool(monkeypatch, [str(path), "alice", "--password-stdin", "--permissions", "write=/queue/a"],
                    stdin="third") == 0
    u = load(str(path))
    assert u.verify("alice", "third") and u.can_write("alice", "/queue/a") and not u.is_admin("alice")

    # delete
    assert run_tool(monkeypatch, [str(path), "legacy", "--delete"]) == 0
    text = path.read_text()
    assert "legacy" not in text and "# trailing comment" in text and "# stompbroker users" in text
    assert load(str(path)).logins == {"alice", "bob"}

    # failures change nothing
    before = path.read_bytes()
    capsys.readouterr()
    assert run_tool(monkeypatch, [str(path), "nobody", "--delete"]) == 1
    assert "no user" in capsys.readouterr().err
    assert run_tool(monkeypatch, [str(path), "bob"], prompts=["one", "two"]) == 1
    assert "differ" in capsys.readouterr().err
    assert run_tool(monkeypatch, [str(path), "bob", "--password-stdin"], stdin="\n") == 1
    assert run_tool(monkeypatch, [str(path), "bob", "--password-stdin", "--permissions", "read=a b"],
                    stdin="x\n") == 1
    assert path.read_bytes() == before
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]  # no temp files left behind


def test_passwd_command_creates_file_and_refuses_bad_input(tmp_path, monkeypatch, capsys):
    path = tmp_path / "sub" / "passwd"
    path.parent.mkdir()
    assert run_tool(monkeypatch, [str(path), "first", "--password-stdin"], stdin="s3cret") == 0
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert load(str(path)).verify("first", "s3cret")
    # a malformed file is not rewritten
    path.write_text("ok:x\nbroken line\n")
    assert run_tool(monkeypatch, [str(path), "ok", "--password-stdin"], stdin="y") == 1
    assert ":2:" in capsys.readouterr().err
    assert path.read_text() == "ok:x\nbroken line\n"
    # bad logins are usage errors
    for login in ("a:b", "a b", "#x", ""):
        with pytest.raises(SystemExit) as info:
            run_tool(monkeypatch, [str(path), login, "--password-stdin"], stdin="y")
        assert info.value.code == 2


def test_passwd_command_keeps_symlink(tmp_path, monkeypatch):
    target = tmp_path / "real"
    target.write_text("a:x\n")
    link = tmp_path / "link"
    link.symlink_to(target)
    assert run_tool(monkeypatch, [str(link), "b", "--password-stdin"], stdin="y") == 0
    assert link.is_symlink() and load(str(target)).logins == {"a", "b"}


def test_passwd_command_as_a_process(tmp_path):
    path = tmp_path / "passwd"
    result = subprocess.run([sys.executable, "-m", "stompbroker.tools.passwd", str(path), "proc", "--password-stdin"],
                            input=b"from-a-process\n", capture_output=True, cwd=ROOT, timeout=60)
    assert result.returncode == 0, result.stderr
    assert load(str(path)).verify("proc", "from-a-process")


# -- Authenticator: pure decisions, the time given by the caller -----------------------------------
def test_authenticator_check_reads_no_clock():
    from stompbroker.broker.auth import Authenticator
    from stompbroker.settings import make_config

    auth = Authenticator(make_config(secret=SECRET), Users())
    login, passcode = make_token("alice", SECRET, NOW)
    assert auth.check(login, passcode, NOW) == "alice"
    assert auth.check(login, passcode, NOW + 10 * 86400) is None      # stale at the time given


def test_a_console_passcode_is_for_its_user_and_address_once_and_never_a_password(tmp_path):
    from stompbroker.broker.auth import Authenticator
    from stompbroker.settings import make_config

    path = tmp_path / "passwd"
    path.write_text(f"root:{hash_secret('toor')}:admin\nbob:{hash_secret('b')}\n")
    auth = Authenticator(make_config(auth="passwd", console_token_ttl_ms=60_000), load(str(path)))
    token = auth.console.mint("root", "10.0.0.1", 100.0)
    assert token.startswith("console-") and auth.check("root", token, NOW) is None   # not a password
    assert not auth.console_login("bob", token, "10.0.0.1", 100.0)
    assert not auth.console_login("root", token, "10.0.0.2", 100.0)
    assert not auth.console_login("root", token, "10.0.0.1", 160.0)   # expired
    assert auth.console_login("root", token, "10.0.0.1", 159.0)
    assert not auth.console_login("root", token, "10.0.0.1", 159.0)   # used once
    token = auth.console.mint("bob", "10.0.0.1", 100.0)                # (the dispatcher mints for admins only)
    assert not auth.console_login("bob", token, "10.0.0.1", 100.0)
    token = auth.console.mint("root", "10.0.0.1", 100.0)
    auth.replace_users(load(str(path)))                                 # SIGHUP: every passcode goes
    assert not auth.console_login("root", token, "10.0.0.1", 100.0)


def test_console_passcodes_are_a_bounded_pool_per_user():
    from stompbroker.security.console_tokens import ConsoleTokens

    tokens = ConsoleTokens(ttl=60.0, per_user=3)
    mine = [tokens.mint("root", "a", 0.0) for _ in range(4)]
    others = [tokens.mint(f"admin{i}", "a", 0.0) for i in range(50)]
    assert len(tokens) == 3 + 50
    assert not tokens.redeem("root", mine[0], "a", 1.0)                 # root's oldest went for root's newest
    assert all(tokens.redeem("root", t, "a", 1.0) for t in mine[1:])
    assert tokens.redeem("admin7", others[7], "a", 1.0)
    tokens.mint("admin8", "a", 100.0)                                    # expired ones go as new ones come
    assert len(tokens._by_user["admin8"]) == 1
