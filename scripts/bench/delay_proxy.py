"""A TCP relay that delays every byte sent towards its target, as a link with that one-way
latency would: `scripts/bench.sh flush --s3-delay MS` puts it between lakecdc and the local S3
server, so that the bench also measures a flush against a distant store (each request waits
at least MS ms before the server sees it; answers are not delayed, order is kept).

usage: delay_proxy.py TARGET_HOST TARGET_PORT DELAY_MS
Prints the port it listens on (127.0.0.1, chosen by the system), then serves until killed.
"""

import asyncio
import sys
import time


async def pump(reader, writer, delay):
    queue = asyncio.Queue()

    async def read():
        while True:
            data = await reader.read(1 << 16)
            await queue.put((time.monotonic(), data))
            if not data:
                return

    async def write():
        while True:
            arrived, data = await queue.get()
            wait = arrived + delay - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()

    # Either side failing (a reset) ends both, and the connection is closed.
    tasks = [asyncio.ensure_future(read()), asyncio.ensure_future(write())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in tasks:
            if task.done() and task.exception() is not None:
                writer.close()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def main():
    host, port, delay = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]) / 1000

    async def relay(client_reader, client_writer):
        try:
            server_reader, server_writer = await asyncio.open_connection(host, port)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(
            pump(client_reader, server_writer, delay),
            pump(server_reader, client_writer, 0),
        )
        server_writer.close()
        client_writer.close()

    server = await asyncio.start_server(relay, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


asyncio.run(main())
