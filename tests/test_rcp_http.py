"""The HTTP layer of the RCP server (uvicorn + Starlette) on raw loopback sockets, and
property-based fuzzing of the stdio and HTTP servers with hostile JSON-RPC frames."""

from __future__ import annotations

import http.client
import json
import logging
import queue
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import faiss
import pytest
import rcp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from llama_index.core import StorageContext, VectorStoreIndex
from llama_index.core.schema import TextNode
from llama_index.vector_stores.faiss import FaissVectorStore

from llama_index_hyde_plus.server.http import Limits, RcpHttpServer, RepeatedWarning
from llama_index_hyde_plus.server.rcp import MAX_BATCH, TransformService, build_server
from llama_index_hyde_plus.testing import DeterministicEmbedding, echo_llm

from .conftest import DOCS, Served

TOKEN = "s3cret"


def make_index() -> VectorStoreIndex:
    embed = DeterministicEmbedding(dim=64)
    store = FaissVectorStore(faiss_index=faiss.IndexFlatIP(embed.dim))
    nodes = [TextNode(id_=nid, text=text) for nid, text in DOCS.items()]
    return VectorStoreIndex(
        nodes, storage_context=StorageContext.from_defaults(vector_store=store), embed_model=embed
    )


def start(token: str | None = None, **limits: Any) -> RcpHttpServer:
    service = TransformService(echo_llm(), make_index().as_retriever(similarity_top_k=10))
    server = RcpHttpServer(build_server(service, http=True), token=token, limits=Limits(**limits))
    return server.start()


@pytest.fixture
def guarded() -> Iterator[RcpHttpServer]:
    server = start(TOKEN, header_timeout=1.0, body_timeout=1.0, max_connections=8)
    yield server
    server.stop()


def exchange(server: RcpHttpServer, data: bytes, wait: float = 5.0) -> bytes:
    """Send ``data`` on one connection; everything the server sends until it closes
    the connection (or ``wait`` seconds of silence)."""
    with socket.create_connection(server.address, timeout=wait) as sock:
        sock.sendall(data)
        out = b""
        try:
            while chunk := sock.recv(65536):
                out += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    return out


def responses(raw: bytes) -> list[tuple[int, dict[str, Any]]]:
    """(status, JSON body) of every HTTP response in ``raw``."""
    out = []
    while raw:
        head, _, rest = raw.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        headers = {
            k.strip().lower(): v.strip() for k, _, v in (ln.partition(b":") for ln in lines[1:])
        }
        length = int(headers.get(b"content-length", b"0"))
        body, raw = rest[:length], rest[length:]
        out.append((status, json.loads(body) if body else {}))
    return out


def post(body: bytes, *headers: str, token: str | None = TOKEN) -> bytes:
    lines = ["POST /rcp HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    if token:
        lines.append(f"Authorization: Bearer {token}")
    lines += headers
    if not any(h.lower().startswith(("content-length", "transfer-encoding")) for h in headers):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


PING = b'{"jsonrpc": "2.0", "id": 9, "method": "ping", "params": {"nonce": "smuggled"}}'


def test_a_request_hidden_in_the_body_of_a_401_is_never_served(guarded: RcpHttpServer) -> None:
    hidden = post(PING, "Connection: keep-alive")
    got = responses(exchange(guarded, post(hidden, token=None)))
    assert got == [
        (
            401,
            {
                "jsonrpc": "2.0",
                "id": None,
                "error": {"code": -32012, "message": got[0][1]["error"]["message"]},
            },
        )
    ]
    assert guarded.requests == 1


def test_keep_alive_serves_pipelined_requests_in_order(guarded: RcpHttpServer) -> None:
    got = responses(exchange(guarded, post(PING) + post(PING, "Connection: close")))
    assert [status for status, _ in got] == [200, 200]
    assert all(body["result"] == {"nonce": "smuggled"} for _, body in got)


def test_a_chunked_body_is_decoded(guarded: RcpHttpServer) -> None:
    chunks = b"".join(
        b"%x\r\n%s\r\n" % (len(PING[i : i + 10]), PING[i : i + 10]) for i in range(0, len(PING), 10)
    )
    raw = post(chunks + b"0\r\n\r\n", "Transfer-Encoding: chunked", "Connection: close")
    assert responses(exchange(guarded, raw)) == [
        (200, {"jsonrpc": "2.0", "id": 9, "result": {"nonce": "smuggled"}})
    ]


def test_a_chunked_body_over_1_mib_gets_413(guarded: RcpHttpServer) -> None:
    chunk = b"x" * 65536
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(17)) + b"0\r\n\r\n"
    got = responses(exchange(guarded, post(body, "Transfer-Encoding: chunked")))
    assert got[0][0] == 413 and got[0][1]["error"]["code"] == rcp.Errc.PAYLOAD_TOO_LARGE


@pytest.mark.parametrize(
    "headers",
    [
        ("Content-Length: 5", "Content-Length: 7"),
        ("Content-Length: 5, 7",),
        ("Content-Length: -1",),
        ("Content-Length: 5", "Transfer-Encoding: chunked"),
        ("Transfer-Encoding: gzip, chunked",),
    ],
    ids=["duplicate", "list", "negative", "with-chunked", "unknown-coding"],
)
def test_ambiguous_framing_is_refused_and_the_connection_closed(
    guarded: RcpHttpServer, headers: tuple[str, ...]
) -> None:
    raw = post(b"5\r\n{}{}{\r\n0\r\n\r\n" + PING, *headers)
    got = responses(exchange(guarded, raw))
    assert len(got) == 1 and got[0][0] in (400, 501)
    assert got[0][1]["error"]["code"] == rcp.Errc.INVALID_REQUEST
    assert guarded.requests <= 1  # the trailing request was never served


def test_a_missing_content_length_is_an_empty_body(guarded: RcpHttpServer) -> None:
    got = responses(exchange(guarded, post(b"", "Connection: close")[:-4] + b"\r\n\r\n"))
    assert got[0][1]["error"]["code"] == rcp.Errc.INVALID_REQUEST


def test_a_half_sent_request_head_is_dropped_after_the_timeout(guarded: RcpHttpServer) -> None:
    start = time.perf_counter()
    got = exchange(guarded, b"POST /rcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    assert time.perf_counter() - start < 4
    assert responses(got)[0][0] == 408


def test_a_body_that_never_arrives_gets_408(guarded: RcpHttpServer) -> None:
    start = time.perf_counter()
    got = responses(exchange(guarded, post(b"{", "Content-Length: 100")))
    assert time.perf_counter() - start < 4
    assert got[0][0] == 408 and got[0][1]["error"]["code"] == rcp.Errc.TIMEOUT


def test_slowloris_connections_are_capped_and_reaped(guarded: RcpHttpServer) -> None:
    held = []
    for _ in range(8):
        sock = socket.create_connection(guarded.address)
        sock.sendall(b"POST /rcp HTTP/1.1\r\n")
        held.append(sock)
    time.sleep(0.2)
    refused = exchange(guarded, post(PING), wait=3)  # the ninth connection
    assert responses(refused)[0][0] == 503
    time.sleep(1.5)  # past the 1 s head timeout: the held connections are gone
    for sock in held:
        sock.settimeout(2)
        assert sock.recv(65536).startswith(b"HTTP/1.1 408")
        sock.close()
    time.sleep(0.2)
    assert responses(exchange(guarded, post(PING, "Connection: close")))[0][0] == 200


def test_get_is_answered_405_with_a_json_rpc_error(guarded: RcpHttpServer) -> None:
    got = responses(exchange(guarded, b"GET /rcp HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
    assert got[0][0] == 405 and got[0][1]["error"]["code"] == rcp.Errc.INVALID_REQUEST


def test_not_http_at_all_gets_400_with_a_json_rpc_error(guarded: RcpHttpServer) -> None:
    got = responses(exchange(guarded, b'{"jsonrpc": "2.0", "id": 1, "method": "ping"}\r\n\r\n'))
    assert got[0][0] == 400 and got[0][1]["error"]["code"] == rcp.Errc.INVALID_REQUEST


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="max_inflight"):
        Limits(max_inflight=0)
    with pytest.raises(ValueError, match="header_timeout"):
        Limits(header_timeout=0)


def slow_body(address: tuple[str, int]) -> socket.socket:
    """A connection that sent a request head and 1 byte of its 100-byte body."""
    sock = socket.create_connection(address, timeout=10)
    sock.sendall(post(b"{", "Content-Length: 100", token=None))
    return sock


def refused_among(held: list[socket.socket], expected: int) -> int:
    """How many of ``held`` are answered 503 (waits until ``expected`` are, or 100
    rounds of select pass without news)."""
    answered: set[socket.socket] = set()
    for _ in range(100):
        if len(answered) >= expected:
            break
        ready, _, _ = select.select([s for s in held if s not in answered], [], [], 0.2)
        for sock in ready:
            answered.add(sock)
            assert sock.recv(65536).startswith(b"HTTP/1.1 503")
    return len(answered)


def test_real_requests_are_served_while_64_slow_bodies_are_held() -> None:
    served = Served("--llm", "scripted")  # the real server, default limits
    host, port = served.url.removeprefix("http://").split("/")[0].rsplit(":", 1)
    address = (host, int(port))
    held = [slow_body(address) for _ in range(64)]
    try:
        assert refused_among(held, 64 - Limits().slow_bodies_per_client) == 56
        for i in range(10):
            ping = PING.replace(b"smuggled", b"real-%d" % i)
            with socket.create_connection(address, timeout=10) as sock:
                sock.sendall(post(ping, "Connection: close", token=None))
                got = b""
                while chunk := sock.recv(65536):
                    got += chunk
            assert responses(got) == [
                (200, {"jsonrpc": "2.0", "id": 9, "result": {"nonce": f"real-{i}"}})
            ]
    finally:
        for sock in held:
            sock.close()
        out = served.stop()
    assert "Traceback" not in out
    assert out.count("WARNING") <= 1  # the refusals are summarised, not one line each


def test_a_body_still_arriving_holds_no_in_flight_slot() -> None:
    server = start(None, max_inflight=1, body_timeout=30.0)
    held = slow_body(server.address)
    try:
        assert responses(exchange(server, post(PING, "Connection: close", token=None))) == [
            (200, {"jsonrpc": "2.0", "id": 9, "result": {"nonce": "smuggled"}})
        ]
    finally:
        held.close()
        server.stop()


def test_slow_bodies_are_capped_per_client_address() -> None:
    server = start(None, slow_bodies_per_client=2, body_timeout=30.0)
    held = [slow_body(server.address) for _ in range(5)]
    try:
        assert refused_among(held, 3) == 3
    finally:
        for sock in held:
            sock.close()
        server.stop()


def test_refused_connections_are_summarised_not_logged_one_by_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = start(None, max_connections=2, header_timeout=30.0)
    held = [socket.create_connection(server.address) for _ in range(2)]
    for sock in held:
        sock.sendall(b"POST /rcp HTTP/1.1\r\n")
    try:
        with caplog.at_level(logging.WARNING, logger="llama_index_hyde_plus.server.http"):
            for _ in range(30):
                assert responses(exchange(server, post(PING), wait=10))[0][0] == 503
        warnings = [r for r in caplog.records if r.name == "llama_index_hyde_plus.server.http"]
        assert len(warnings) == 1 and "refused 1 connection" in warnings[0].getMessage()
    finally:
        for sock in held:
            sock.close()
        server.stop()


def test_a_repeated_warning_says_how_many_times_since_the_last(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    warning = RepeatedWarning("refused %d", every=60.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="llama_index_hyde_plus.server.http"):
        for step in range(200):
            now[0] = step * 0.5  # 200 refusals over 100 s
            warning.note()
    assert [r.getMessage() for r in caplog.records] == ["refused 1", "refused 120"]
    assert warning.pending == 79


@pytest.mark.parametrize("token", ["pässword", "пароль", "two words", "tab\there", "\u20ac"])
def test_a_token_that_cannot_travel_in_a_header_is_refused_at_start(token: str) -> None:
    service = TransformService(echo_llm())
    with pytest.raises(ValueError, match="printable ASCII"):
        RcpHttpServer(build_server(service, http=True), token=token)


# -- property-based fuzzing ----------------------------------------------------------

RAW_NUMBERS = [
    "1e999",
    "-1e999",
    "1e-999",
    "1" + "0" * 400,
    "-0",
    "123456789012345678901234567890",
    "NaN",
    "Infinity",
]
METHODS = [
    "initialize",
    "info",
    "ping",
    "query/transform",
    "retrieve",
    "embed",
    "notifications/cancel",
    "foo/bar",
]
KEYS = [
    "query",
    "method",
    "n",
    "k",
    "rewrite",
    "protocolVersion",
    "nonce",
    "_meta",
    "filter",
    "candidateK",
]

leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
    st.sampled_from([f"__RAW{i}__" for i in range(len(RAW_NUMBERS))]),
    st.sampled_from(["hyde", "multi-query", "rewrite", "decompose", "step-back", "Why?"]),
)
values = st.recursive(
    leaves,
    lambda kids: (
        st.lists(kids, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), kids, max_size=4)
    ),
    max_leaves=10,
)
request = st.fixed_dictionaries(
    {"jsonrpc": st.sampled_from(["2.0", "2.0", "1.0", 2])},
    optional={
        "id": st.one_of(st.integers(0, 10**6), st.text(max_size=8), st.none(), values),
        "method": st.sampled_from(METHODS) | values,
        "params": st.dictionaries(st.sampled_from(KEYS), values, max_size=4) | values,
    },
)


def to_text(value: Any) -> str:
    text = json.dumps(value, allow_nan=True)
    for i, raw in enumerate(RAW_NUMBERS):
        text = text.replace(f'"__RAW{i}__"', raw)
    return text


deep = st.builds(
    lambda depth, kind: {
        "array": "[" * depth + "]" * depth,
        "object": '{"a":' * depth + "1" + "}" * depth,
        "in-params": '{"jsonrpc":"2.0","id":1,"method":"ping","params":{"nonce":'
        + "[" * depth
        + "]" * depth
        + "}}",
        "in-id": '{"jsonrpc":"2.0","id":' + "[" * depth + "]" * depth + ',"method":"ping"}',
    }[kind],
    st.integers(30, 3000),
    st.sampled_from(["array", "object", "in-params", "in-id"]),
)
frames = st.one_of(
    request.map(to_text),
    st.lists(request, min_size=0, max_size=4).map(to_text),
    st.tuples(request, st.integers(MAX_BATCH - 2, MAX_BATCH + 40)).map(
        lambda r: to_text([r[0]] * r[1])
    ),
    values.map(to_text),
    deep,
    st.binary(max_size=120).map(lambda b: b.decode("latin-1")),
)


def must_answer(text: str) -> bool:
    """Whether JSON-RPC requires at least one response to this frame."""
    if not text.strip():
        return False
    try:
        message = json.loads(text)
    except (ValueError, RecursionError):
        return True
    items = message if isinstance(message, list) else [message]
    if not items:
        return True
    return any(
        not isinstance(m, dict) or "id" in m or not isinstance(m.get("method"), str) for m in items
    )


def well_formed(reply: Any) -> bool:
    if isinstance(reply, list):
        return bool(reply) and all(well_formed(r) and not isinstance(r, list) for r in reply)
    if not isinstance(reply, dict) or reply.get("jsonrpc") != "2.0" or "id" not in reply:
        return False
    if ("result" in reply) == ("error" in reply):
        return False
    error = reply.get("error")
    return error is None or (
        isinstance(error.get("code"), int) and isinstance(error.get("message"), str)
    )


def check_id(text: str, reply: Any) -> None:
    """A single request with a plain id is answered with that id."""
    try:
        message = json.loads(text)
    except (ValueError, RecursionError):
        return
    plain_id = isinstance(message, dict) and type(message.get("id")) in (int, str)
    if plain_id and isinstance(message.get("method"), str) and reply.get("id") is not None:
        assert reply["id"] == message["id"]


class StdioPeer:
    """``hyde-plus serve --stdio`` with a reader thread, so reads can time out."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "llama_index_hyde_plus.cli",
                "serve",
                "--stdio",
                "--llm",
                "scripted",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.lines: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.sentinel = 0

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(b"")

    def send(self, data: bytes) -> list[Any]:
        """Send one frame, then a ping; the replies that came before the ping's."""
        assert self.proc.stdin is not None
        self.sentinel += 1
        mark = f"sentinel-{self.sentinel}"
        ping = json.dumps({"jsonrpc": "2.0", "id": mark, "method": "ping"}).encode()
        self.proc.stdin.write(data + b"\n" + ping + b"\n")
        self.proc.stdin.flush()
        replies = []
        while True:
            line = self.lines.get(timeout=30)
            assert line, (
                f"the server died: {self.proc.stderr.read().decode() if self.proc.stderr else ''}"
            )
            reply = json.loads(line)
            if isinstance(reply, dict) and reply.get("id") == mark:
                return replies
            replies.append(reply)

    def close(self) -> str:
        assert self.proc.stdin is not None and self.proc.stderr is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
        return self.proc.stderr.read().decode()


@pytest.fixture(scope="module")
def stdio_peer() -> Iterator[StdioPeer]:
    peer = StdioPeer()
    yield peer
    stderr = peer.close()
    assert peer.proc.returncode == 0 and "Traceback" not in stderr, stderr


@pytest.fixture(scope="module")
def fuzz_http() -> Iterator[RcpHttpServer]:
    server = start(None, header_timeout=0.5, body_timeout=0.5)
    yield server
    server.stop()


FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@FUZZ
@given(text=frames)
def test_fuzz_stdio_every_frame_gets_well_formed_replies(stdio_peer: StdioPeer, text: str) -> None:
    data = text.replace("\n", " ").encode("utf-8", "surrogatepass")
    replies = stdio_peer.send(data)
    assert all(well_formed(r) for r in replies), replies
    if must_answer(text.replace("\n", " ")):
        assert len(replies) == 1, replies
        check_id(text, replies[0])
    assert stdio_peer.proc.poll() is None


@FUZZ
@given(text=frames)
def test_fuzz_http_every_request_gets_a_well_formed_reply(
    fuzz_http: RcpHttpServer, text: str
) -> None:
    host, port = fuzz_http.address
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        body = text.encode("utf-8", "surrogatepass")
        conn.request("POST", "/rcp", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        payload = resp.read()
    finally:
        conn.close()
    if resp.status == 204:
        assert not payload and not must_answer(text)
        return
    reply = json.loads(payload)
    assert well_formed(reply), reply
    check_id(text, reply)
    assert rcp.connect_http(fuzz_http.url).ping(nonce="alive") == {"nonce": "alive"}


@settings(FUZZ, max_examples=80)
@given(data=st.binary(min_size=1, max_size=300))
def test_fuzz_http_garbage_bytes_get_an_http_answer(fuzz_http: RcpHttpServer, data: bytes) -> None:
    raw = exchange(fuzz_http, data + b"\r\n\r\n", wait=2)
    if raw:  # a complete but bad request line: 400 with a JSON-RPC body
        status, body = responses(raw)[0]
        assert status in (400, 405, 408, 413) or well_formed(body)
        if status >= 400:
            assert body["error"]["code"] in (
                rcp.Errc.INVALID_REQUEST,
                rcp.Errc.TIMEOUT,
                rcp.Errc.PAYLOAD_TOO_LARGE,
                rcp.Errc.UNAUTHORIZED,
            )
    assert rcp.connect_http(fuzz_http.url).ping() == {}
