"""python -m stompbroker.analysis DUMPS... --out DIR [--master URL] [--format md|html]"""

import sys

from stompbroker.analysis.report import main

if __name__ == "__main__":
    sys.exit(main())
