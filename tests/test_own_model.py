"""Bringing your own model: ``--llm PATH.gguf`` (any GGUF file on the bundled llama.cpp)
and ``--llm http://HOST:PORT/v1`` (any OpenAI-compatible server), read by the one
resolver (`models.resolve_llm`) and checked before LlamaIndex loads."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from llama_index_hyde_plus._model_spec import read_llm_spec
from llama_index_hyde_plus.cli import app
from llama_index_hyde_plus.models import resolve_embedding, resolve_llm

runner = CliRunner()
TINY = Path(__file__).parent / "data" / "tiny-beir"


class _Models(BaseHTTPRequestHandler):
    """Answers ``GET /v1/models`` with two models and records the headers it got."""

    seen: list[dict[str, str]] = []

    def do_GET(self) -> None:
        type(self).seen.append(dict(self.headers))
        body = json.dumps({"object": "list", "data": [{"id": "first-7b"}, {"id": "second"}]})
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def models_server() -> Iterator[str]:
    _Models.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Models)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_a_server_without_a_model_name_gets_its_first_listed_model(
    models_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HYDE_PLUS_LLM_MODEL", raising=False)
    monkeypatch.delenv("HYDE_PLUS_LLM_API_KEY", raising=False)
    llm = resolve_llm(models_server + "/", temperature=0.2, max_tokens=40, seed=3)
    assert type(llm).__name__ == "OpenAILike"
    assert llm.model == "first-7b" and llm.api_base == models_server  # type: ignore[attr-defined]
    assert (llm.temperature, llm.max_tokens) == (0.2, 40)  # type: ignore[attr-defined]
    assert llm.metadata.is_chat_model and llm.additional_kwargs == {"seed": 3}  # type: ignore[attr-defined]
    assert resolve_llm(models_server).max_tokens == 256  # type: ignore[attr-defined]


def test_a_server_never_gets_the_openai_key(
    models_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-the-users-openai-key")
    monkeypatch.delenv("HYDE_PLUS_LLM_MODEL", raising=False)
    monkeypatch.delenv("HYDE_PLUS_LLM_API_KEY", raising=False)
    llm = resolve_llm(models_server)
    assert "sk-the-users-openai-key" not in json.dumps(_Models.seen)
    assert llm.api_key != "sk-the-users-openai-key"  # type: ignore[attr-defined]


def test_a_server_s_model_and_key_come_from_the_environment(
    models_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HYDE_PLUS_LLM_MODEL", "second")
    monkeypatch.setenv("HYDE_PLUS_LLM_API_KEY", "server-key")
    llm = resolve_llm(models_server)
    assert llm.model == "second" and llm.api_key == "server-key"  # type: ignore[attr-defined]
    assert _Models.seen == []  # a named model needs no listing
    monkeypatch.delenv("HYDE_PLUS_LLM_MODEL")
    resolve_llm(models_server)
    assert _Models.seen[-1]["Authorization"] == "Bearer server-key"


def test_a_server_that_does_not_answer_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    monkeypatch.delenv("HYDE_PLUS_LLM_MODEL", raising=False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nobody listens there
    with pytest.raises(
        ValueError, match=r"could not list the server's models.*HYDE_PLUS_LLM_MODEL"
    ):
        resolve_llm(f"http://127.0.0.1:{port}/v1")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("http://", "not a server address"),
        ("http://127.0.0.1:80/v1?x=1", "not a server address"),
        ("http://127.0.0.1:eighty/v1", "port of 127.0.0.1 is not a number"),
        ("MISSING.gguf", "GGUF file not found"),
        ("NOTGGUF.gguf", "is not a GGUF model file"),
        ("local:mymodel", "give your own model as --llm PATH.gguf"),
        ("claude", "use auto, local, openai[:MODEL], PATH.gguf or http://HOST:PORT/v1"),
    ],
)
def test_a_bad_llm_is_named_before_anything_loads(tmp_path: Path, spec: str, message: str) -> None:
    (tmp_path / "NOTGGUF.gguf").write_text("not a model")
    spec = spec.replace("MISSING", str(tmp_path / "missing")).replace(
        "NOTGGUF", str(tmp_path / "NOTGGUF")
    )
    with pytest.raises(ValueError, match=r"--llm|model choice|'local'") as raised:
        read_llm_spec(spec)
    assert message in str(raised.value)
    with pytest.raises(ValueError) as resolved:
        resolve_llm(spec)
    assert str(resolved.value) == str(raised.value)  # the resolver says the same
    for command in (["query", "q", "--index", str(tmp_path)], ["transform", "q"]):
        result = runner.invoke(app, [*command, "--llm", spec])
        assert result.exit_code == 2 and message in result.output, result.output


def test_an_llm_only_choice_is_not_an_embedding_model(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown model choice"):
        resolve_embedding("http://127.0.0.1:8080/v1")
    with pytest.raises(ValueError, match="unknown model choice"):
        resolve_embedding(str(tmp_path / "m.gguf"))


# -- the real thing: the bundled GGUF as a file, and served over HTTP ---------------


@pytest.fixture(scope="module")
def bundled_gguf() -> Path:
    from llama_index_hyde_plus.local import SMOLLM2
    from llama_index_hyde_plus.local.assets import ensure

    return Path(ensure(SMOLLM2))


@pytest.fixture(scope="module")
def gguf_copy(bundled_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled model under a name of the user's: it gets the capable-model defaults."""
    own = tmp_path_factory.mktemp("own") / "my-model.gguf"
    own.symlink_to(bundled_gguf)
    return own


@pytest.fixture(scope="module")
def llama_server(bundled_gguf: Path) -> Iterator[str]:
    """xllamacpp's own HTTP server (llama.cpp's server, OpenAI-compatible) on loopback."""
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(bundled_gguf)
    params.n_parallel = 2
    params.n_ctx = 2048 * 2
    params.cpuparams.n_threads = 1
    params.cpuparams_batch.n_threads = 1
    params.warmup = False
    params.verbosity = -1
    params.hostnames = ["127.0.0.1"]
    params.port = 0
    server = xllamacpp.Server(params)
    yield f"{server.listening_address}/v1"
    del server


def _no_fallbacks(results: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(results.read_text())
    for row in data["results"]:
        assert row["fallbacks"] == 0, row
    return data


def _own_models(request: pytest.FixtureRequest, which: str) -> str:
    fixture = "gguf_copy" if which == "gguf" else "llama_server"
    return str(request.getfixturevalue(fixture))


@pytest.mark.local
@pytest.mark.slow
@pytest.mark.parametrize("which", ["gguf", "server"])
def test_eval_tune_and_query_run_on_your_own_model(
    which: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HYDE_PLUS_LLM_THREADS", "1")
    monkeypatch.delenv("HYDE_PLUS_LLM_MODEL", raising=False)
    llm = _own_models(request, which)
    common = ["--llm", llm, "--embed", "local", "--cache-dir", str(tmp_path / "cache")]
    common += ["--max-tokens", "48", "--concurrency", "2", "--timeout", "120"]
    evaluated = runner.invoke(
        app,
        [
            *("eval", "--dataset", str(TINY), "--split", "test", "--transforms", "none,hyde"),
            *("--out", str(tmp_path / "out"), *common),
        ],
    )
    assert evaluated.exit_code == 0, evaluated.output
    data = _no_fallbacks(tmp_path / "out" / "results.json")
    expected = "my-model" if which == "gguf" else "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert expected in data["config"]["llm"]

    tuned = runner.invoke(
        app,
        [
            *("tune", "--dataset", str(TINY), "--split", "test", "-t", "hyde"),
            *("--grid", "query_weight=0.5", "--write-anyway"),
            *("--out", str(tmp_path / "tuned.json"), "--report", str(tmp_path / "t.md"), *common),
        ],
    )
    assert tuned.exit_code == 0, tuned.output
    assert "fell back" not in tuned.output and (tmp_path / "tuned.json").is_file()

    index = tmp_path / "index"
    built = runner.invoke(app, ["index", str(TINY), "--out", str(index), "--embed", "local"])
    assert built.exit_code == 0, built.output
    queried = runner.invoke(
        app,
        [
            *("query", "what is measured?", "--index", str(index), "-t", "multi-query"),
            *("--json", "--llm", llm, "--timeout", "120"),
        ],
    )
    assert queried.exit_code == 0, queried.output
    shown = json.loads(queried.output)
    assert shown["transform"]["fallback"] is False, shown["transform"]
