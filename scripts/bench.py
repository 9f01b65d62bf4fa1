#!/usr/bin/env python3
"""The load generator moved into the package: this runs ``stompbroker-bench`` with the same options."""

import sys

from stompbroker.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
