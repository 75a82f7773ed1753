"""HTTP sessions of the RCP server (spec §5.2, §13): a successful ``initialize`` issues a
session token in ``result._meta.session``; a request carrying it in the ``RCP-Session``
header is in that session (a second ``initialize`` there is -32600); requests without
one are served statelessly, or, with ``sessionless="shared"``, as one session for the
whole server (the reference SDK's HTTP model, which the protocol's harness expects)."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import rcp
from llama_index.core import VectorStoreIndex
from typer.testing import CliRunner

from llama_index_hyde_plus.cli import app
from llama_index_hyde_plus.server.http import RcpHttpServer
from llama_index_hyde_plus.server.rcp import (
    SESSION_HEADER,
    SessionTokens,
    TransformService,
    build_server,
    session_key,
)
from llama_index_hyde_plus.testing import echo_llm

INIT_PARAMS = {"protocolVersion": 1, "client": {"name": "t", "version": "1"}}


def post(url: str, message: Any, session: str | None = None, bearer: str | None = None) -> Any:
    """POST one JSON-RPC frame (or batch); the decoded reply (None for a 204), with the
    HTTP status beside it in ``["http"]`` when it is not 200."""
    headers = {"Content-Type": "application/json"}
    if session is not None:
        headers[SESSION_HEADER] = session
    if bearer is not None:
        headers["Authorization"] = f"Bearer {bearer}"
    request = urllib.request.Request(
        url, data=json.dumps(message).encode(), method="POST", headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            body = resp.read()
    except urllib.error.HTTPError as exc:
        return {**json.loads(exc.read()), "http": exc.code}
    return json.loads(body) if body.strip() else None


def call(
    url: str,
    method: str,
    params: Any = None,
    session: str | None = None,
    id_: Any = 1,
    bearer: str | None = None,
) -> Any:
    message = {"jsonrpc": "2.0", "id": id_, "method": method, "params": params or {}}
    return post(url, message, session, bearer)


def code(reply: Any) -> int | None:
    return reply.get("error", {}).get("code") if isinstance(reply, dict) else None


TRANSFORM = {"query": "what is a session", "method": "rewrite"}


def serve(faiss_index: VectorStoreIndex, **options: Any) -> RcpHttpServer:
    service = TransformService(echo_llm(), faiss_index.as_retriever(similarity_top_k=5))
    return RcpHttpServer(build_server(service, http=True, **options)).start()


@pytest.fixture
def stateless(faiss_index: VectorStoreIndex) -> Iterator[RcpHttpServer]:
    server = serve(faiss_index)
    yield server
    server.stop()


@pytest.fixture
def shared(faiss_index: VectorStoreIndex) -> Iterator[RcpHttpServer]:
    server = serve(faiss_index, sessionless="shared")
    yield server
    server.stop()


class SessionTransport(rcp.HttpTransport):  # type: ignore[misc]
    """The official HTTP transport, sending back the session its handshake got (the
    official client itself sends no session)."""

    session: str | None = None

    def call(self, request: dict[str, Any]) -> dict[str, Any]:
        headers = {"Content-Type": "application/json"}
        if self.session is not None:
            headers[SESSION_HEADER] = self.session
        url = self._base + "/" + request.get("method", "")
        req = urllib.request.Request(
            url, data=json.dumps(request).encode(), method="POST", headers=headers
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            reply: dict[str, Any] = json.loads(resp.read())
        issued = (reply.get("result") or {}).get("_meta", {}).get("session")
        if request.get("method") == rcp.Method.INITIALIZE and issued:
            self.session = issued
        return reply


def session_client(url: str) -> tuple[rcp.Client, SessionTransport]:
    transport = SessionTransport(url)
    client = rcp.Client()
    client._transport = transport
    client._handshake()
    return client, transport


# -- sessions with a token ---------------------------------------------------------------


def test_a_successful_initialize_issues_a_session_beside_the_conformance_level(
    stateless: RcpHttpServer,
) -> None:
    meta = call(stateless.url, "initialize", INIT_PARAMS)["result"]["_meta"]
    assert isinstance(meta["session"], str) and len(meta["session"]) >= 22
    assert meta["conformance"] == "L1"
    again = call(stateless.url, "initialize", INIT_PARAMS)["result"]["_meta"]["session"]
    assert again != meta["session"]  # every handshake opens a session of its own


def test_a_failed_initialize_issues_no_session(stateless: RcpHttpServer) -> None:
    reply = call(stateless.url, "initialize", {"protocolVersion": 0})
    assert code(reply) == rcp.Errc.VERSION_MISMATCH
    assert "result" not in reply


def test_a_repeated_initialize_in_a_session_is_rejected_with_32600(
    stateless: RcpHttpServer,
) -> None:
    token = call(stateless.url, "initialize", INIT_PARAMS)["result"]["_meta"]["session"]
    reply = call(stateless.url, "initialize", INIT_PARAMS, session=token, id_="reinit")
    assert code(reply) == rcp.Errc.INVALID_REQUEST
    assert reply["id"] == "reinit"
    assert SESSION_HEADER in reply["error"]["message"]
    # the session is still initialized: its gated calls are served
    assert call(stateless.url, "query/transform", TRANSFORM, session=token)["result"]["queries"]


def test_the_official_client_in_a_session_is_refused_a_second_handshake(
    stateless: RcpHttpServer,
) -> None:
    client, transport = session_client(stateless.url)
    assert transport.session is not None
    assert client.transform("in a session", "rewrite")["queries"]
    with pytest.raises(rcp.RcpError) as info:
        client._handshake()
    assert info.value.code == rcp.Errc.INVALID_REQUEST


def test_a_session_token_unlocks_gated_calls_on_a_server_that_never_saw_a_handshake(
    faiss_index: VectorStoreIndex,
) -> None:
    key = session_key("shared-secret")
    first = serve(faiss_index, session_key=key)
    replica = serve(faiss_index, session_key=key)
    try:
        token = call(first.url, "initialize", INIT_PARAMS)["result"]["_meta"]["session"]
        # the replica never saw an initialize: without a session it refuses...
        assert code(call(replica.url, "query/transform", TRANSFORM)) == rcp.Errc.NOT_INITIALIZED
        # ...with the session its sibling issued, it serves, and refuses a re-handshake
        served = call(replica.url, "query/transform", TRANSFORM, session=token)
        assert served["result"]["queries"]
        again = call(replica.url, "initialize", INIT_PARAMS, session=token)
        assert code(again) == rcp.Errc.INVALID_REQUEST
    finally:
        first.stop()
        replica.stop()


@pytest.mark.parametrize(
    "token",
    [
        "1.forged.AAAAAAAAAAAAAAAAAAAAAAAA",
        "not-a-session",
        "",
        "1." + "x" * 400,
        "1.caf\u00e9.mac",
    ],
)
def test_a_session_this_server_did_not_issue_is_not_initialized(
    stateless: RcpHttpServer, token: str
) -> None:
    rcp.connect_http(stateless.url)  # sessionless requests are now unlocked...
    reply = call(stateless.url, "query/transform", TRANSFORM, session=token)
    # ...but a request naming a session must be in a session this server issued
    assert code(reply) == rcp.Errc.NOT_INITIALIZED
    assert SESSION_HEADER in reply["error"]["message"]
    # info and ping answer whatever the session
    assert call(stateless.url, "info", session=token)["result"]["server"]["name"]
    assert call(stateless.url, "ping", {"nonce": 3}, session=token)["result"] == {"nonce": 3}


def test_another_servers_session_is_not_accepted(faiss_index: VectorStoreIndex) -> None:
    first = serve(faiss_index)
    second = serve(faiss_index)  # its own random key
    try:
        token = call(first.url, "initialize", INIT_PARAMS)["result"]["_meta"]["session"]
        reply = call(second.url, "query/transform", TRANSFORM, session=token)
        assert code(reply) == rcp.Errc.NOT_INITIALIZED
    finally:
        first.stop()
        second.stop()


def test_an_initialize_naming_an_unknown_session_opens_a_new_one(
    stateless: RcpHttpServer,
) -> None:
    reply = call(stateless.url, "initialize", INIT_PARAMS, session="stale-or-foreign")
    token = reply["result"]["_meta"]["session"]
    assert token != "stale-or-foreign"
    assert call(stateless.url, "query/transform", TRANSFORM, session=token)["result"]["queries"]


def test_a_batch_in_a_session_is_served_in_it(stateless: RcpHttpServer) -> None:
    token = call(stateless.url, "initialize", INIT_PARAMS)["result"]["_meta"]["session"]
    batch = [
        {"jsonrpc": "2.0", "id": 1, "method": "query/transform", "params": TRANSFORM},
        {"jsonrpc": "2.0", "id": 2, "method": "initialize", "params": INIT_PARAMS},
        {"jsonrpc": "2.0", "method": "initialize", "params": INIT_PARAMS},  # never answered
    ]
    replies = {r["id"]: r for r in post(stateless.url, batch, session=token)}
    assert set(replies) == {1, 2}
    assert replies[1]["result"]["queries"]
    assert code(replies[2]) == rcp.Errc.INVALID_REQUEST


def test_a_notification_in_a_session_is_not_answered(stateless: RcpHttpServer) -> None:
    token = call(stateless.url, "initialize", INIT_PARAMS)["result"]["_meta"]["session"]
    note = {"jsonrpc": "2.0", "method": "initialize", "params": INIT_PARAMS}
    assert post(stateless.url, note, session=token) is None
    assert post(stateless.url, {**note, "method": "query/transform"}, session="bogus") is None


# -- sessionless requests ------------------------------------------------------------------


def test_sessionless_clients_stay_stateless_by_default(stateless: RcpHttpServer) -> None:
    client, _ = session_client(stateless.url)  # a session client first...
    assert client.transform("mine", "rewrite")["queries"]
    # ...changes nothing for the official client, which sends no session
    clients = [rcp.connect_http(stateless.url) for _ in range(3)]
    for other in clients:
        assert other.transform("theirs", "rewrite")["queries"]
    assert "result" in call(stateless.url, "initialize", INIT_PARAMS, id_="reinit")


def test_shared_sessionless_requests_are_one_session_as_the_harness_expects(
    shared: RcpHttpServer,
) -> None:
    url = shared.url
    assert code(call(url, "query/transform", TRANSFORM)) == rcp.Errc.NOT_INITIALIZED
    note = {"jsonrpc": "2.0", "method": "initialize", "params": INIT_PARAMS}
    assert post(url, note) is None  # a notification changes nothing
    assert code(call(url, "query/transform", TRANSFORM)) == rcp.Errc.NOT_INITIALIZED
    failed = call(url, "initialize", {"protocolVersion": 0})
    assert code(failed) == rcp.Errc.VERSION_MISMATCH
    assert code(call(url, "query/transform", TRANSFORM)) == rcp.Errc.NOT_INITIALIZED
    first = call(url, "initialize", INIT_PARAMS)
    assert first["result"]["protocolVersion"] == 1
    reinit = call(url, "initialize", INIT_PARAMS, id_="reinit")
    assert code(reinit) == rcp.Errc.INVALID_REQUEST and reinit["id"] == "reinit"
    assert call(url, "query/transform", TRANSFORM)["result"]["queries"]
    # the official client, sending no session, is the same session: no second handshake
    with pytest.raises(rcp.RcpError) as info:
        rcp.connect_http(url)
    assert info.value.code == rcp.Errc.INVALID_REQUEST


def test_shared_mode_still_serves_sessions_of_their_own(shared: RcpHttpServer) -> None:
    token = call(shared.url, "initialize", INIT_PARAMS)["result"]["_meta"]["session"]
    assert code(call(shared.url, "initialize", INIT_PARAMS)) == rcp.Errc.INVALID_REQUEST
    assert call(shared.url, "query/transform", TRANSFORM, session=token)["result"]["queries"]
    renewed = call(shared.url, "initialize", INIT_PARAMS, session="expired")
    assert renewed["result"]["_meta"]["session"] != token


def test_shared_mode_a_sessionless_batch_handshakes_once(shared: RcpHttpServer) -> None:
    batch = [
        {"jsonrpc": "2.0", "id": i, "method": "initialize", "params": INIT_PARAMS} for i in range(3)
    ]
    replies = sorted(post(shared.url, batch), key=lambda r: r["id"])
    assert "result" in replies[0]
    assert [code(r) for r in replies[1:]] == [rcp.Errc.INVALID_REQUEST] * 2


def test_shared_mode_concurrent_handshakes_let_exactly_one_succeed(
    faiss_index: VectorStoreIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    import rcp._server as sdk_server

    negotiate = sdk_server.negotiate_version

    def slow_negotiation(version: Any) -> Any:
        time.sleep(0.05)  # widen the window between the SDK's check and its flag
        return negotiate(version)

    monkeypatch.setattr(sdk_server, "negotiate_version", slow_negotiation)
    service = TransformService(echo_llm(), faiss_index.as_retriever())
    server = build_server(service, http=True, sessionless="shared")
    line = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT_PARAMS})
    barrier = threading.Barrier(8)
    replies: list[Any] = []

    def handshake() -> None:
        barrier.wait()
        replies.append(json.loads(server.handle_line(line)))

    threads = [threading.Thread(target=handshake) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(replies) == 8
    assert sum("result" in r for r in replies) == 1
    assert sum(code(r) == rcp.Errc.INVALID_REQUEST for r in replies) == 7


# -- the parts -------------------------------------------------------------------------------


def test_session_tokens_check_what_they_issued() -> None:
    tokens = SessionTokens(b"k" * 32)
    token = tokens.issue(1)
    assert tokens.version(token) == 1
    assert SessionTokens(b"k" * 32).version(token) == 1  # same key: a replica
    assert SessionTokens(b"j" * 32).version(token) is None
    version, nonce, mac = token.split(".")
    assert tokens.version(f"2.{nonce}.{mac}") is None  # the version is signed too
    assert tokens.version(f"{version}.{nonce}x.{mac}") is None
    assert tokens.version(token + "\u00e9") is None
    assert SessionTokens().issue(1) != SessionTokens().issue(1)


def test_session_key_is_derived_from_the_bearer_token() -> None:
    assert session_key("secret") == session_key("secret")
    assert session_key("secret") != session_key("other")
    assert len(session_key("secret")) == 32
    assert b"secret" not in session_key("secret")


def test_build_server_refuses_an_unknown_sessionless_policy(
    faiss_index: VectorStoreIndex,
) -> None:
    service = TransformService(echo_llm(), faiss_index.as_retriever())
    with pytest.raises(ValueError, match="sessionless"):
        build_server(service, http=True, sessionless="sticky")


def test_the_sessionless_option_is_for_http_only() -> None:
    result = CliRunner().invoke(
        app, ["serve", "--stdio", "--llm", "scripted", "--sessionless", "shared"]
    )
    assert result.exit_code != 0
    assert "--sessionless" in result.output and "--http" in result.output


def test_the_sessionless_option_takes_stateless_or_shared() -> None:
    result = CliRunner().invoke(
        app, ["serve", "--http", "0", "--llm", "scripted", "--sessionless", "sticky"]
    )
    assert result.exit_code != 0
    assert "stateless" in result.output and "shared" in result.output


def test_serve_sessionless_shared_over_http_end_to_end() -> None:
    from .conftest import Served

    served = Served("--llm", "scripted", "--sessionless", "shared")
    try:
        assert code(call(served.url, "query/transform", TRANSFORM)) == rcp.Errc.NOT_INITIALIZED
        assert "result" in call(served.url, "initialize", INIT_PARAMS)
        assert code(call(served.url, "initialize", INIT_PARAMS)) == rcp.Errc.INVALID_REQUEST
        assert call(served.url, "query/transform", TRANSFORM)["result"]["queries"]
    finally:
        served.stop()


def test_replicas_sharing_a_token_share_sessions_and_still_demand_the_token() -> None:
    from .conftest import Served

    first = Served("--llm", "scripted", "--token", "replica-secret")
    second = Served("--llm", "scripted", "--token", "replica-secret")
    other = Served("--llm", "scripted", "--token", "another-secret")
    try:
        init = call(first.url, "initialize", INIT_PARAMS, bearer="replica-secret")
        token = init["result"]["_meta"]["session"]
        served = call(second.url, "query/transform", TRANSFORM, token, bearer="replica-secret")
        assert served["result"]["queries"]
        again = call(second.url, "initialize", INIT_PARAMS, token, bearer="replica-secret")
        assert code(again) == rcp.Errc.INVALID_REQUEST
        # a session is no credential: without the bearer token, 401 before any session
        refused = call(second.url, "query/transform", TRANSFORM, token)
        assert refused["http"] == 401 and code(refused) == rcp.Errc.UNAUTHORIZED
        # a server with another token signs with another key
        foreign = call(other.url, "query/transform", TRANSFORM, token, bearer="another-secret")
        assert code(foreign) == rcp.Errc.NOT_INITIALIZED
    finally:
        for served_process in (first, second, other):
            served_process.stop()
