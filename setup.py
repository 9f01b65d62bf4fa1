"""Metadata is in setup.cfg; this file adds the compiled modules, which are optional: without a C
compiler the install goes on and the broker runs its pure-Python parser (docs/performance.md)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension(f"stompbroker.protocol.{name}", [f"stompbroker/protocol/{name}.c"], optional=True)
                   for name in ("_framesplit", "_headparse", "_headrender")])
