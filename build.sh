#!/usr/bin/env bash
# ./build.sh             make .venv/ and install the package with its test extras (and what they need)
# ./build.sh test [ARGS] run every test suite: Python (pytest ARGS), then the Node.js suite in js-examples/
# ./build.sh run ARGS    run the broker, e.g. ./build.sh run processors=4 port=61613 TTL=5000
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}

setup() {
    [ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
    .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
    .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test]"
}

case "${1:-setup}" in
    setup)
        setup ;;
    test)
        shift
        setup
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
