"""A local HTTP(S) server standing in for a webhook's receiver: its path says how to answer.
The tests of the webhook handler and of alert notices use it (the `receiver` fixture)."""

import ssl
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

HUGE_BYTES = 50 * 1024 * 1024


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    client_port: int  # one port per TCP connection


class Receiver(ThreadingHTTPServer):
    """A webhook receiver whose path says how to answer: /ok, /status/<code>?retry_after=...,
    /binary, /slow?seconds=..., /huge, /redirect?location=..."""

    daemon_threads = True

    def __init__(self, tls_context: ssl.SSLContext | None = None):
        super().__init__(("127.0.0.1", 0), ReceiverHandler)
        if tls_context is not None:
            self.socket = tls_context.wrap_socket(self.socket, server_side=True)
        self.received: list[Received] = []
        self.huge_sent: list[int] = []
        self.huge_done = threading.Event()
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return self.server_address[1]

    def url(self, path: str, host: str = "127.0.0.1", scheme: str = "http") -> str:
        return f"{scheme}://{host}:{self.port}{path}"

    def reset(self):
        self.received.clear()
        self.huge_sent.clear()
        self.huge_done.clear()

    def stop(self):
        self.shutdown()
        self.server_close()


class ReceiverHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, so that connection reuse is visible

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        url = urlsplit(self.path)
        query = {key: values[0] for key, values in parse_qs(url.query).items()}
        self.server.received.append(Received(self.command, url.path, dict(self.headers), body,
                                             self.client_address[1]))
        try:
            self.answer(url.path, query)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    do_PUT = do_PATCH = do_POST

    def answer(self, path: str, query: dict[str, str]):
        if path == "/ok":
            self.reply(200, b'{"received": true}')
        elif path.startswith("/status/"):
            status = int(path.rsplit("/", 1)[1])
            headers = {"Retry-After": query["retry_after"]} if "retry_after" in query else {}
            self.reply(status, b"" if status == 204 else b"the receiver says why", headers)
        elif path == "/binary":
            self.reply(200, b"ok\x00\xff")
        elif path == "/slow":
            time.sleep(float(query["seconds"]))
            self.reply(200, b"late")
        elif path == "/huge":
            self.send_huge()
        elif path == "/redirect":
            self.reply(302, b"", {"Location": query["location"]})
        else:
            self.reply(404, b"no such hook")

    def reply(self, status: int, body: bytes, headers: dict[str, str] | None = None):
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def send_huge(self):
        self.send_response(200)
        self.send_header("Content-Length", str(HUGE_BYTES))
        self.end_headers()
        sent = 0
        chunk = b"x" * 65536
        try:
            while sent < HUGE_BYTES:
                self.wfile.write(chunk)
                sent += len(chunk)
        finally:
            self.server.huge_sent.append(sent)
            self.server.huge_done.set()

    def log_message(self, format, *args):
        pass
