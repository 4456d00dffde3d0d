# SPDX-License-Identifier: Apache-2.0
"""What the Python checks of the integration tests share (lib.sh's pycheck
reads their output): an "ok: " line per check that held, a "FAIL: " line
and exit status 1 for the first that did not; and waiting for a condition
with a deadline."""
import sys
import time


def fail(msg):
    print(f"FAIL: {msg}", flush=True)
    sys.exit(1)


def say(msg):
    print(f"ok: {msg}", flush=True)


def wait_for(cond, seconds):
    """Polls cond until it holds or seconds pass; whether it held."""
    end = time.monotonic() + seconds
    while not cond():
        if time.monotonic() >= end:
            return False
        time.sleep(0.002)  # poll interval of a condition with a deadline
    return True
