# SPDX-License-Identifier: Apache-2.0
"""A peer that begins a message and never finishes it: connects to a ZeroMQ
ROUTER (ipc://PATH or tcp://HOST:PORT) as a raw ZMTP 3.0 DEALER with the NULL
mechanism, announces a frame of 100 KiB (under every daemon's frame limit),
sends 1,000 bytes of it and goes silent.
Prints "closed S" with the seconds until the daemon dropped the connection,
or "open" after LIMIT seconds (exit 1).

  python3 tests/integration/zmtp-stall.py ENDPOINT LIMIT
"""
import socket
import struct
import sys
import time


def main():
    ep, limit = sys.argv[1], float(sys.argv[2])
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
    # A long frame (flag 0x02) of 100 KiB, the last of its message, begun only.
    s.sendall(bytes([0x02]) + struct.pack(">Q", 100 << 10) + b"\0" * 1000)
    t0 = time.monotonic()
    s.settimeout(0.25)
    while time.monotonic() - t0 < limit:
        try:
            if not s.recv(65536):
                break
        except socket.timeout:
            continue
        except OSError:
            break
    else:
        print("open")
        return 1
    print(f"closed {time.monotonic() - t0:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
