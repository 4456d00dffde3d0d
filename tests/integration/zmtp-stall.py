# SPDX-License-Identifier: Apache-2.0
"""Peers that begin a message and never finish it: COUNT connections (1) to a
ZeroMQ ROUTER (ipc://PATH or tcp://HOST:PORT), each a raw ZMTP 3.0 DEALER
with the NULL mechanism that announces a frame of FRAME bytes (100 KiB, under
every daemon's frame limit), sends 1,000 bytes of it and goes silent. Prints
"closed S" with the seconds until the daemon had dropped them all, or "open
N" (N of them still open) after LIMIT seconds (exit 1).

  python3 tests/integration/zmtp-stall.py ENDPOINT LIMIT [COUNT [FRAME]]
"""
import select
import socket
import struct
import sys
import time


def stall(ep, frame):
    if ep.startswith("ipc://"):
        s = socket.socket(socket.AF_UNIX)
        s.connect(ep[len("ipc://"):])
    else:
        host, port = ep[len("tcp://"):].rsplit(":", 1)
        s = socket.create_connection((host, int(port)))
    # Greeting: signature, version 3.0, mechanism NULL, not as-server, filler.
    s.sendall(b"\xff" + b"\0" * 8 + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\0") + b"\0" + b"\0" * 31)
    ready = b"\x05READY" + b"\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER"
    s.sendall(bytes([0x04, len(ready)]) + ready)
    # A long frame (flag 0x02), the last of its message, begun only.
    s.sendall(bytes([0x02]) + struct.pack(">Q", frame) + b"\0" * 1000)
    s.setblocking(False)
    return s


def main():
    ep, limit = sys.argv[1], float(sys.argv[2])
    count = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    frame = int(sys.argv[4]) if len(sys.argv) > 4 else 100 << 10
    socks = [stall(ep, frame) for _ in range(count)]
    t0 = time.monotonic()
    while socks and time.monotonic() - t0 < limit:
        ready, _, _ = select.select(socks, [], [], 0.25)
        for s in ready:
            try:
                if s.recv(65536):
                    continue  # the daemon's greeting, READY, pings
            except BlockingIOError:
                continue
            except OSError:
                pass
            s.close()
            socks.remove(s)
    if socks:
        print(f"open {len(socks)}")
        return 1
    print(f"closed {time.monotonic() - t0:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
