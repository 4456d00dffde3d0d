# SPDX-License-Identifier: Apache-2.0
"""What the Python checks of the integration tests share (lib.sh's pycheck
reads their output): an "ok: " line per check that held, a "FAIL: " line
and exit status 1 for the first that did not."""
import sys


def fail(msg):
    print(f"FAIL: {msg}", flush=True)
    sys.exit(1)


def say(msg):
    print(f"ok: {msg}", flush=True)
