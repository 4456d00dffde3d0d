#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Listens on a unix datagram socket as systemd's NOTIFY_SOCKET does and writes
every message received, one per line, to a file, until killed or told to stop
after N seconds. Used by test-services.sh:  notify-listen.py SOCKET OUT SECONDS"""
import os
import socket
import sys
import time

path, out, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
if os.path.exists(path):
    os.unlink(path)
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(path)
s.settimeout(0.5)
end = time.monotonic() + seconds
with open(out, "a", buffering=1) as f:
    while time.monotonic() < end:
        try:
            data = s.recv(4096)
        except socket.timeout:
            continue
        for line in data.decode(errors="replace").splitlines():
            f.write(line + "\n")
