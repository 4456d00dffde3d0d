# SPDX-License-Identifier: Apache-2.0
"""Peers that begin a message and never finish it: COUNT connections (1) to a
ZeroMQ ROUTER (ipc://PATH or tcp://HOST:PORT), each a raw ZMTP 3.0 DEALER
with the NULL mechanism that announces a frame of FRAME bytes (100 KiB, under
every daemon's frame limit), sends 1,000 bytes of it and goes silent. Prints
"closed S" with the seconds until the daemon had dropped them all, or "open
N" (N of them still open) after LIMIT seconds (exit 1).

  python3 tests/integration/zmtp-stall.py ENDPOINT LIMIT [COUNT [FRAME]]

--message: one message of frames of FRAME bytes each (all but the last with
MORE), TOTAL bytes in all, sent as fast as the daemon reads. Prints "closed
N" with the bytes sent when the daemon dropped the connection, or "sent N"
once all of it went (exit 1).

  python3 tests/integration/zmtp-stall.py --message ENDPOINT TOTAL FRAME

--trickle: one connection that sends a message a frame of 16 bytes at a time
(each with MORE), one frame every quarter second: whole frames keep ZeroMQ's
heartbeat time-out from firing, where a frame begun and never finished does
not. Prints "closed S" once it is dropped, or "open" after LIMIT seconds
(exit 1).

  python3 tests/integration/zmtp-stall.py --trickle ENDPOINT LIMIT

--zmtp1: a ZMTP 1.0 peer (no greeting: a frame's length first), whose
framing the daemons do not read. Prints "closed S" once it is dropped, or
"open" after LIMIT seconds (exit 1).

  python3 tests/integration/zmtp-stall.py --zmtp1 ENDPOINT LIMIT
"""
import select
import socket
import struct
import sys
import time


def connect(ep):
    if ep.startswith("ipc://"):
        s = socket.socket(socket.AF_UNIX)
        s.connect(ep[len("ipc://"):])
    else:
        host, port = ep[len("tcp://"):].rsplit(":", 1)
        s = socket.create_connection((host, int(port)))
    return s


def dealer(ep):
    s = connect(ep)
    # Greeting: signature, version 3.0, mechanism NULL, not as-server, filler.
    s.sendall(b"\xff" + b"\0" * 8 + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\0") + b"\0" + b"\0" * 31)
    ready = b"\x05READY" + b"\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER"
    s.sendall(bytes([0x04, len(ready)]) + ready)
    return s


def ready(s):
    """Waits for the daemon's READY: message frames before it would be a
    protocol error (libzmq's own peers wait for it too)."""
    s.settimeout(5)
    got = b""
    while b"READY" not in got:
        more = s.recv(65536)
        if not more:
            print("closed during the handshake")
            return False
        got += more
    return True


def stall(ep, frame):
    s = dealer(ep)
    # A long frame (flag 0x02), the last of its message, begun only.
    s.sendall(bytes([0x02]) + struct.pack(">Q", frame) + b"\0" * 1000)
    s.setblocking(False)
    return s


def message(ep, total, frame):
    s = dealer(ep)
    if not ready(s):
        return 1
    s.settimeout(30)
    body = b"\0" * frame
    sent = 0
    try:
        while sent < total:
            last = sent + frame >= total
            s.sendall(bytes([0x02 | (0 if last else 0x01)]) + struct.pack(">Q", frame) + body)
            sent += frame
    except OSError:
        print(f"closed {sent}")
        return 0
    print(f"sent {sent}")
    return 1


def trickle(ep, limit):
    s = dealer(ep)
    if not ready(s):
        return 1
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < limit:
            s.sendall(bytes([0x01, 16]) + b"\0" * 16)
            time.sleep(0.25)  # the trickle's pace: a frame every quarter second
    except OSError:
        print(f"closed {time.monotonic() - t0:.1f}")
        return 0
    print("open")
    return 1


def zmtp1(ep, limit):
    s = connect(ep)
    t0 = time.monotonic()
    try:
        # ZMTP 1.0: a frame's length (flags byte included), flags, body.
        s.sendall(bytes([5, 0]) + b"DEAL")
        s.settimeout(limit)
        while s.recv(65536):
            pass
    except OSError:
        pass
    if time.monotonic() - t0 >= limit:
        print("open")
        return 1
    print(f"closed {time.monotonic() - t0:.1f}")
    return 0


def main():
    if sys.argv[1] == "--message":
        return message(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    if sys.argv[1] == "--trickle":
        return trickle(sys.argv[2], float(sys.argv[3]))
    if sys.argv[1] == "--zmtp1":
        return zmtp1(sys.argv[2], float(sys.argv[3]))
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
