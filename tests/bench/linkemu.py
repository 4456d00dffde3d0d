# SPDX-License-Identifier: Apache-2.0
"""A slow, lossy link in user space, for benchmarks where tc netem is not
there (no sch_netem in the kernel, or no root): a TCP proxy that gives every
connection through it a link of its own, each direction shaped apart.

    linkemu.py LISTEN-PORT TARGET-HOST:PORT RATE-MBIT DELAY-MS LOSS

Each direction of each connection: the bytes leave at RATE-MBIT (a
serialising clock, as a link's transmitter) and arrive DELAY-MS later (one
way; the round trip is twice it). Loss is not dropped packets but what it
does to a TCP stream: with segments lost at rate LOSS, a Reno/CUBIC-like
sender in steady state moves at most 1.22 x MSS / (RTT x sqrt(LOSS)) (Mathis,
Semke, Mahdavi and Ott, 1997), so the stream leaves at the lower of that and
RATE-MBIT (1% loss and a 100 ms round trip: 1.41 Mbit/s). What netem does and
this does not: slow start, the loss of a connection's first packets, and a
bounded queue in front of the link. Runs until killed."""
import asyncio
import math
import sys

SEG = 1448


class Link:
    def __init__(self, rate_mbit, delay_ms, loss):
        self.delay = delay_ms / 1000.0
        self.bps = rate_mbit * 1e6
        if loss > 0:
            self.bps = min(self.bps, 1.22 * SEG * 8 / (2 * self.delay * math.sqrt(loss)))

    async def pump(self, reader, writer):
        loop = asyncio.get_running_loop()
        q = asyncio.Queue()

        async def deliver():
            while True:
                due, data = await q.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if data is None:
                    break
                writer.write(data)
                await writer.drain()
            try:
                writer.write_eof()
            except (OSError, RuntimeError):
                pass

        task = asyncio.create_task(deliver())
        free = 0.0  # when the link's transmitter is free again
        sent = 0
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                free = max(free, loop.time()) + len(data) * 8 / self.bps
                sent += len(data)
                q.put_nowait((free + self.delay, data))
        except (ConnectionError, OSError):
            pass
        q.put_nowait((free + self.delay, None))
        await task
        return sent


async def main():
    port, target, rate, delay, loss = sys.argv[1:6]
    host, tport = target.rsplit(":", 1)
    link = Link(float(rate), float(delay), float(loss))

    async def serve(cr, cw):
        try:
            sr, sw = await asyncio.open_connection(host, int(tport))
        except OSError:
            cw.close()
            return
        await asyncio.gather(link.pump(cr, sw), link.pump(sr, cw))
        for w in (sw, cw):
            w.close()

    server = await asyncio.start_server(serve, "127.0.0.1", int(port))
    print(f"linkemu: listening port={port} target={target} rate_mbit={rate} delay_ms={delay} loss={loss} "
          f"stream_mbit={link.bps / 1e6:.2f}", file=sys.stderr, flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
