"""Metadata is in setup.cfg; this file adds the one compiled module, which is optional: without a C
compiler the install goes on and the broker runs its pure-Python parser (docs/performance.md)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("stompbroker.protocol._framesplit", ["stompbroker/protocol/_framesplit.c"],
                             optional=True)])
