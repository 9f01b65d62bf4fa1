#!/usr/bin/env bash
# ./build.sh run ARGS    run the broker, e.g. ./build.sh run processors=4 port=61613 TTL=5000
#                        (installs only the broker: seconds, ~30 MB; nothing when nothing changed;
#                        with a cluster=nats://... argument also the `cluster` extra: nats-py, nats-server)
# ./build.sh test [ARGS] run every test suite: Python (pytest ARGS), then the Node.js suite in js-examples/
# ./build.sh analysis    install the diagnostics analysis (PySpark, Java) and JupyterLab for the notebook
# ./build.sh [setup]     install everything for development (what `test` needs), run nothing
#
# Each install is remembered in .venv/.installed-<extras>, keyed on a hash of setup.cfg,
# pyproject.toml, setup.py and the C source: pip runs again only when they change (or with FORCE_INSTALL=1).
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}

venv() {
    [ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
}

# install EXTRAS: the package (editable) with a comma list of setup.cfg extras ("" = the broker alone)
install() {
    local extras=$1 stamp want log
    stamp=.venv/.installed-${extras:-broker}
    want=$(cat setup.cfg pyproject.toml setup.py stompbroker/protocol/*.c | sha256sum | cut -d' ' -f1)
    if [ "${FORCE_INSTALL:-0}" != 1 ]; then
        [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && return 0
        # every install includes the broker itself
        [ -z "$extras" ] && grep -qsx "$want" .venv/.installed-* && return 0
    fi
    venv
    need_cc
    log=$(mktemp)
    if ! .venv/bin/python -m pip install -q --disable-pip-version-check -e ".${extras:+[$extras]}" >"$log" 2>&1; then
        cat "$log" >&2
        rm -f "$log"
        return 1
    fi
    rm -f "$log"
    echo "$want" >"$stamp"
}

# The install compiles the STOMP frame splitter, head decoder and MESSAGE renderer (stompbroker/protocol/*.c):
# a C compiler and Python's headers. Without them pip goes on and the broker parses in pure Python (slower).
need_cc() {
    local headers
    headers=$("$PYTHON" -c 'import os, sysconfig; print(os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))')
    command -v cc >/dev/null 2>&1 && [ "$headers" = True ] && return
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc libc6-dev python3-dev >/dev/null
    else
        echo "build.sh: no C compiler or Python headers: the frame splitter and head decoder stay pure Python (e.g. apt-get install gcc python3-dev)" >&2
    fi
}

# The Spark analysis needs a Java runtime: install one where it is missing and we may.
need_java() {
    command -v java >/dev/null 2>&1 && return 0
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq default-jre-headless >/dev/null
    else
        echo "build.sh: the Spark analysis needs Java 17+ (e.g. apt-get install default-jre-headless)" >&2
    fi
}

# The console's browser test drives Debian's chromium (playwright uses it; no browser download).
need_chromium() {
    [ -x /usr/bin/chromium ] && return
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    else
        echo "build.sh: the console's browser test needs chromium (e.g. apt-get install chromium)" >&2
    fi
}

# The cluster tests run docker/haproxy.cfg in front of real nodes (no Docker needed).
need_haproxy() {
    command -v haproxy >/dev/null 2>&1 && return
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy >/dev/null
    else
        echo "build.sh: the load balancer test needs haproxy (e.g. apt-get install haproxy)" >&2
    fi
}

# The HTTP guards' off-loopback test runs the broker in a network namespace it makes (ip netns, veth).
need_iproute2() {
    command -v ip >/dev/null 2>&1 && return
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 >/dev/null
    else
        echo "build.sh: the off-loopback HTTP test needs iproute2 and root (e.g. apt-get install iproute2)" >&2
    fi
}

setup_test() {
    install "test,analysis,bench"
    need_java
}

setup_analysis() {
    install "analysis,notebook"
    need_java
}

# The Python suite in two passes: most of it on two workers, a file to a worker (its tests wait on
# brokers, NATS and Spark more than they compute) and the longest files first (tests/conftest.py),
# then the files marked `alone` (tests/conftest.py: they bound latency or memory, which another
# test beside them would disturb) on their own.
# A pass with nothing to run (pytest's exit 5, when ARGS select no test of it) is no failure.
run_pytest() {
    local rc=0 alone=0
    .venv/bin/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder -m "not alone" "$@" || rc=$?
    [ "$rc" = 5 ] && rc=0
    .venv/bin/python -m pytest -m alone "$@" || alone=$?
    [ "$alone" = 5 ] && alone=0
    [ "$rc" = 0 ] && rc=$alone
    return "$rc"
}

case "${1:-setup}" in
    setup)
        setup_test ;;
    test)
        shift
        setup_test
        need_chromium
        need_haproxy
        need_iproute2
        run_pytest "$@"
        command -v npm >/dev/null || { echo "build.sh: js-examples/ needs Node.js 20+ and npm" >&2; exit 1; }
        (cd js-examples && npm ci --omit=optional --no-audit --no-fund --loglevel=error && npm test) ;;
    analysis)
        setup_analysis
        echo "build.sh: analysis ready: .venv/bin/stompbroker-diag-report, .venv/bin/jupyter lab scripts/" >&2 ;;
    run)
        shift
        extras=""
        for arg in "$@"; do  # cluster mode needs nats-py (and brings the nats-server binary)
            case "$arg" in cluster=?*|--cluster=?*) extras=cluster ;; esac
        done
        install "$extras" >&2
        exec .venv/bin/stompbroker "$@" ;;
    *)
        echo "usage: ./build.sh [setup | run [broker settings] | test [pytest args] | analysis]" >&2
        exit 2 ;;
esac
