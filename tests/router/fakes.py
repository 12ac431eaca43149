"""A deliberately broken OpenAI server: the FAILING backend of the router's fault tests (never a good one).

It speaks just enough HTTP/1.1 (on raw asyncio streams, so it can misbehave at the socket level)
to pass health checks, then fails every completion request in the chosen way (``slow`` alone answers
correctly, at a pace a test controls: the stream a drain or a lost registry is seen through; ``stale``
answers too, then drops the connection it kept alive):

- ``crash``: closes the connection after reading the request, before any response byte;
- ``error500``: answers 500 with an error body;
- ``reject``: answers 400 with an error body and keeps the connection open (an engine refusing a request);
- ``hang``: never answers;
- ``drop``: starts a 200 SSE stream, sends two chunks, then cuts the connection;
- ``flood``: starts a 200 SSE stream and writes events as fast as the socket takes them, up to
  ``FLOOD_BYTES`` (a runaway stream far faster than any client reads; a CPU vLLM makes ~18 tokens/s,
  too slow to show back-pressure). ``flood_sent[i]``: bytes of the i-th stream the router (and the
  kernel's socket buffers) took so far;
- ``nodone``: starts a 200 SSE stream, sends two chunks, then ends the chunked body cleanly (the
  terminating zero-size chunk) without ``data: [DONE]``: an engine that stopped without finishing;
- ``stale``: answers every completion correctly (a JSON body, the connection kept alive), then closes that
  connection when the next request arrives on it, without answering it: a server closing its idle
  keep-alive connection just as a request goes out (``stale_closes`` counts them);
- ``slow``: a 200 SSE stream of ``slow_chunks`` chunks, one every ``slow_interval_s`` seconds, then
  ``[DONE]``; the number of chunks a request asks for in ``max_tokens``, when given, overrides
  ``slow_chunks`` (so one server can serve short and long streams). Correct, but slow: for drains.
"""

from __future__ import annotations

import asyncio
import json
import threading

from polyspec.core.ports import free_port

MODEL_ID = "broken-engine-model"
MODES = ("crash", "error500", "reject", "hang", "drop", "flood", "nodone", "slow", "stale")
FLOOD_BYTES = 512 * 1024 * 1024


def _response(status: str, body: bytes, content_type: str = "application/json", *, close: bool = False) -> bytes:
    # A server that closes the connection after its answer says so (Connection: close), as uvicorn does;
    # without it the router would pool the connection and a request a moment later could pick it as it closes.
    connection = "Connection: close\r\n" if close else ""
    head = f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n{connection}\r\n"
    return head.encode() + body


# The head of every streamed answer: the fake closes the connection after a stream, so it says so.
STREAM_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
               b"Connection: close\r\n\r\n")


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


class BrokenEngine:
    def __init__(self, mode: str, model_id: str = MODEL_ID, *, slow_interval_s: float = 0.2,
                 slow_chunks: int = 10_000) -> None:
        assert mode in MODES, mode
        self.mode = mode
        self.slow_interval_s = slow_interval_s
        self.slow_chunks = slow_chunks
        self.model_id = model_id
        self.port = free_port()
        self.completion_requests = 0
        self.health_probes = 0  # GET /health answered
        self.last_body: dict | None = None  # the completion request as the router forwarded it
        self.last_headers: dict[str, str] = {}
        self.connections_closed_by_peer = 0
        self.stale_closes = 0
        self.flood_sent: list[int] = []  # flood: bytes per stream, as far as the socket took them
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._ready = threading.Event()
        self._server: asyncio.AbstractServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", self.port))
        self._ready.set()
        self._loop.run_forever()
        # Let the cancelled connection handlers finish inside the loop, then close it: a handler left
        # pending would run its ``finally`` at garbage collection, on a closed loop.
        pending = asyncio.all_tasks(self._loop)
        self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self._loop.close()

    def __enter__(self) -> BrokenEngine:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        def _stop() -> None:
            assert self._server is not None
            self._server.close()
            for task in asyncio.all_tasks(self._loop):
                task.cancel()
            self._loop.stop()

        self._loop.call_soon_threadsafe(_stop)
        self._thread.join(10)

    async def _read_request(self, reader: asyncio.StreamReader) -> tuple[str, str]:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                name, value = line.split(":", 1)
                headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", 0))
        body = await reader.readexactly(length) if length else b""
        if method == "POST":
            self.last_headers, self.last_body = headers, json.loads(body or b"null")
        return method, path

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        answered = False  # stale: this connection carried an answer already
        try:
            while True:
                method, path = await self._read_request(reader)
                if method == "GET" and path == "/health":
                    self.health_probes += 1
                    writer.write(_response("200 OK", b""))
                elif method == "GET" and path == "/v1/models":
                    body = {"object": "list", "data": [{"id": self.model_id, "object": "model"}]}
                    writer.write(_response("200 OK", json.dumps(body).encode()))
                elif self.mode == "stale":
                    self.completion_requests += 1
                    if answered:  # a request on a connection the server has already let go
                        self.stale_closes += 1
                        return
                    answered = True
                    body = {"id": "x", "object": "chat.completion", "model": self.model_id,
                            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello"},
                                         "finish_reason": "stop"}]}
                    writer.write(_response("200 OK", json.dumps(body).encode()))
                elif self.mode == "reject":  # answered, and the connection stays open for the next request
                    self.completion_requests += 1
                    body = {"error": {"message": "bad request", "type": "BadRequestError", "param": None, "code": 400}}
                    writer.write(_response("400 Bad Request", json.dumps(body).encode()))
                else:
                    self.completion_requests += 1
                    await self._fail(reader, writer)
                    return
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            self.connections_closed_by_peer += 1
        finally:
            writer.close()

    async def _fail(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode == "crash":
            writer.transport.abort()  # RST, no byte sent
        elif self.mode == "error500":
            body = {"error": {"message": "engine exploded", "type": "InternalServerError", "param": None, "code": 500}}
            writer.write(_response("500 Internal Server Error", json.dumps(body).encode(), close=True))
            await writer.drain()
        elif self.mode == "hang":
            await reader.read()  # until the router gives up and closes
            self.connections_closed_by_peer += 1
        elif self.mode == "drop":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            for text in ("Hel", "lo"):
                event = {"id": "x", "object": "chat.completion.chunk", "model": self.model_id,
                         "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
                writer.write(_chunk(f"data: {json.dumps(event)}\n\n".encode()))
                await writer.drain()
            await asyncio.sleep(0.05)
            writer.transport.abort()
        elif self.mode in ("nodone", "slow"):
            await self._stream_slowly(writer)
        elif self.mode == "flood":
            writer.write(STREAM_HEAD)
            event = {"id": "x", "object": "chat.completion.chunk", "model": self.model_id,
                     "choices": [{"index": 0, "delta": {"content": "flood " * 100}, "finish_reason": None}]}
            block = _chunk(f"data: {json.dumps(event)}\n\n".encode() * 64)  # ~40 KB of events per write
            stream = len(self.flood_sent)
            self.flood_sent.append(0)
            while self.flood_sent[stream] < FLOOD_BYTES:
                writer.write(block)
                await writer.drain()  # blocks while the router reads nothing: back-pressure
                self.flood_sent[stream] += len(block)
            writer.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            await writer.drain()

    async def _stream_slowly(self, writer: asyncio.StreamWriter) -> None:
        writer.write(STREAM_HEAD)
        if self.mode == "nodone":
            texts = ["Hel", "lo"]
        else:
            count = (self.last_body or {}).get("max_tokens") or self.slow_chunks
            texts = [f"t{i} " for i in range(count)]
        for i, text in enumerate(texts):
            if i and self.mode == "slow":
                await asyncio.sleep(self.slow_interval_s)
            event = {"id": "x", "object": "chat.completion.chunk", "model": self.model_id,
                     "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
            writer.write(_chunk(f"data: {json.dumps(event)}\n\n".encode()))
            await writer.drain()
        if self.mode == "slow":
            writer.write(_chunk(b"data: [DONE]\n\n"))
        writer.write(b"0\r\n\r\n")  # the end of the chunked body: a clean end at the HTTP level
        await writer.drain()
