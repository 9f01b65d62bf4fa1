#!/usr/bin/env bash
# ./build.sh             make .venv/ and install the package with its test extras (and what they need)
# ./build.sh test [ARGS] run every test suite: Python (pytest ARGS), then the Node.js suite in js-examples/
# ./build.sh run ARGS    run the broker, e.g. ./build.sh run processors=4 port=61613 TTL=5000
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}

setup() {
    [ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
    .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null 2>&1 || true
    local log
    log=$(mktemp)
    if ! .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test,analysis,bench]" >"$log" 2>&1; then
        cat "$log" >&2
        rm -f "$log"
        return 1
    fi
    rm -f "$log"
    # The Spark analysis needs a Java runtime: install one where it is missing and we may.
    if ! command -v java >/dev/null 2>&1; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
            apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq default-jre-headless >/dev/null
        else
            echo "build.sh: the Spark analysis needs Java 17+ (e.g. apt-get install default-jre-headless)" >&2
        fi
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

case "${1:-setup}" in
    setup)
        setup ;;
    test)
        shift
        setup
        need_chromium
        .venv/bin/python -m pytest "$@"
        command -v npm >/dev/null || { echo "build.sh: js-examples/ needs Node.js 20+ and npm" >&2; exit 1; }
        (cd js-examples && npm ci --omit=optional --no-audit --no-fund --loglevel=error && npm test) ;;
    run)
        shift
        setup >&2
        exec .venv/bin/stompbroker "$@" ;;
    *)
        echo "usage: ./build.sh [setup | test [pytest args] | run [broker settings]]" >&2
        exit 2 ;;
esac
