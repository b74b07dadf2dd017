"""A TCP proxy on loopback that delays every chunk it forwards (a slow network to Redis)."""

from __future__ import annotations

import asyncio
import contextlib
import threading


class SlowProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target_port``, sleeping ``delay_s`` before each chunk
    from the client (so every Redis round trip costs at least ``delay_s``). Runs its own event
    loop on a thread; :meth:`stop` ends it."""

    def __init__(self, target_port: int, delay_s: float = 0.0) -> None:
        self.target_port = target_port
        self.delay_s = delay_s
        self.port = 0
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
        self._thread.start()
        ready.wait(10)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        ready.set()
        self._loop.run_forever()
        server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, slow: bool) -> None:
            with contextlib.suppress(OSError):
                while chunk := await src.read(1 << 16):
                    if slow and self.delay_s:
                        await asyncio.sleep(self.delay_s)
                    dst.write(chunk)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer, True), pipe(up_reader, writer, False))

    def stop(self) -> None:
        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._loop.stop()

        asyncio.run_coroutine_threadsafe(cancel_all(), self._loop)
        self._thread.join(5)
