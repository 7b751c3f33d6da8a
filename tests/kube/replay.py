"""A local HTTP server that answers what a real kube-apiserver answered.

``recorded/recordings/*.json`` hold exchanges recorded between the official ``kubernetes``
client and a real kube-apiserver (see ``recorded/NOTES.md``). A test picks the exchanges of
one scenario; :class:`RecordedApiServer` serves them on 127.0.0.1. Each request the adapter
sends must be one of the recorded requests, byte for byte in meaning: the same method, path,
query parameters, ``Content-Type`` and JSON body. The server answers it with the recorded
status, headers and body (watch streams as chunked newline-delimited events, as the real one
did). A request that matches no remaining exchange is answered ``599`` and kept in
:attr:`RecordedApiServer.mismatches` with the closest recorded request, so the test that
drove it fails saying what differed.

Exchanges are consumed in order: of the remaining ones, the first that matches answers. The
same request recorded twice (a GET before and after a patch) therefore gets its answers in
the order they were recorded.
"""

from __future__ import annotations

import copy
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.fixtures.http_server import QuietHTTPServer

RECORDED = Path(__file__).parent / "recorded"
RECORDINGS = RECORDED / "recordings"
CRDS = RECORDED / "crds"
GOOD_TOKEN = "switchyard-test-token"


def exchanges(name: str, *indices: int) -> list[dict[str, Any]]:
    """The exchanges of recording ``name`` (``"02-nodes"``), all or those at ``indices``."""
    recorded = json.loads((RECORDINGS / f"{name}.json").read_text())["exchanges"]
    if not indices:
        return recorded
    return [recorded[i] for i in indices]


def answered(request: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    """The recorded request of one exchange with the recorded answer of another, for a
    scenario whose answer was recorded for a neighbouring request (a 404 for an object not
    made yet, a 409 or 403 for a write): both halves are real; the note says which."""
    return {**request, "note": f"{request['note']} / answered as: {response['note']}",
            "status": response["status"], "response_headers": response["response_headers"],
            "response_body": response["response_body"]}


#: Switchyard's field manager: every write it makes names it (``fieldManager=switchyard``).
FIELD_MANAGER = "switchyard"
_WRITES = ("POST", "PUT", "PATCH")


def by_switchyard(exchange: dict[str, Any]) -> dict[str, Any]:
    """A recorded create, update or patch as Switchyard sends it: naming its field manager.

    Most writes were recorded without ``fieldManager``, so the client's default manager
    (``OpenAPI-Generator``, from its User-Agent) owns what they wrote. The API server takes
    ``fieldManager`` on every create, update and patch, and it changes nothing of the answer
    but the manager named in ``managedFields``: the recorded answer stands, with that name
    changed to ``switchyard``. Reads, deletes and writes that already name a manager (the
    server-side applies) are returned as recorded."""
    query = _query(exchange["query"])
    if exchange["method"] not in _WRITES or "fieldManager" in query:
        return exchange
    raw = exchange["query"]
    body = copy.deepcopy(exchange["response_body"])
    if isinstance(body, dict):
        for entry in (body.get("metadata") or {}).get("managedFields") or []:
            if isinstance(entry, dict) and entry.get("manager") == "OpenAPI-Generator":
                entry["manager"] = FIELD_MANAGER
    return {**exchange, "note": f"{exchange['note']} (sent with fieldManager={FIELD_MANAGER})",
            "query": f"{raw}&fieldManager={FIELD_MANAGER}" if raw else
                     f"fieldManager={FIELD_MANAGER}",
            "response_body": body}


def _path(path: str) -> str:
    return path.rstrip("/") or "/"


def _query(raw: str) -> dict[str, list[str]]:
    return parse_qs(raw, keep_blank_values=True)


@dataclass
class Received:
    method: str
    path: str
    query: dict[str, list[str]]
    content_type: str
    authorization: str
    body: Any


@dataclass
class RecordedApiServer:
    """Serves ``exchanges`` in order on 127.0.0.1; see the module docstring."""

    exchanges: list[dict[str, Any]]
    received: list[Received] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._remaining = list(self.exchanges)
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                return

            def _handle(self) -> None:
                server._serve(self)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

        self._httpd = QuietHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> RecordedApiServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> RecordedApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def unused(self) -> list[str]:
        """The notes of the exchanges nobody asked for."""
        return [e["note"] for e in self._remaining]

    def assert_all_matched(self) -> None:
        assert not self.mismatches, "requests not recorded from the real server:\n" + "\n".join(
            self.mismatches
        )

    # ---------------------------------------------------------------------------------------

    def _serve(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        parts = urlsplit(handler.path)
        got = Received(
            method=handler.command,
            path=_path(parts.path),
            query=_query(parts.query),
            content_type=(handler.headers.get("Content-Type") or "").split(";")[0].strip(),
            authorization=handler.headers.get("Authorization") or "",
            body=body,
        )
        with self._lock:
            self.received.append(got)
            match = next((e for e in self._remaining if self._matches(e, got)), None)
            if match is not None:
                self._remaining.remove(match)
            else:
                self.mismatches.append(self._explain(got))
        if match is None:
            self._reply(handler, 599, {"Content-Type": "text/plain"}, "no recorded exchange")
            return
        self._reply(
            handler, match["status"], match.get("response_headers") or {}, match["response_body"]
        )

    @staticmethod
    def _matches(exchange: dict[str, Any], got: Received) -> bool:
        recorded_type = (exchange["request_headers"].get("Content-Type") or "").split(";")[0]
        return (
            exchange["method"] == got.method
            and _path(exchange["path"]) == got.path
            and _query(exchange["query"]) == got.query
            and recorded_type == got.content_type
            and exchange.get("request_body") == got.body
            and got.authorization.startswith("Bearer ")
        )

    def _explain(self, got: Received) -> str:
        same_target = [
            e for e in self._remaining
            if e["method"] == got.method and _path(e["path"]) == got.path
        ]
        lines = [f"{got.method} {got.path} {got.query} content-type={got.content_type!r}",
                 f"  body: {json.dumps(got.body, sort_keys=True)[:2000]}"]
        if not same_target:
            lines.append("  no remaining recorded exchange has this method and path")
        for e in same_target[:3]:
            lines.append(f"  recorded ({e['note']}): query={_query(e['query'])} "
                         f"content-type={e['request_headers'].get('Content-Type', '')!r}")
            lines.append(f"    body: {json.dumps(e.get('request_body'), sort_keys=True)[:2000]}")
        return "\n".join(lines)

    @staticmethod
    def _reply(handler: BaseHTTPRequestHandler, status: int, headers: dict[str, str],
               body: Any) -> None:
        handler.send_response(status)
        content_type = headers.get("Content-Type", "application/json")
        handler.send_header("Content-Type", content_type)
        if isinstance(body, list) and headers.get("Transfer-Encoding") == "chunked":
            # A watch: one event per line, chunked, then the end of the stream.
            handler.send_header("Transfer-Encoding", "chunked")
            handler.end_headers()
            for line in body:
                data = (line + "\n").encode()
                handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            handler.wfile.write(b"0\r\n\r\n")
            handler.wfile.flush()
            return
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)
        handler.wfile.flush()
