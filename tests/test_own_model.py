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

from llama_index_hyde_plus._model_spec import LlmSpec, read_llm_spec
from llama_index_hyde_plus.cli import app
from llama_index_hyde_plus.models import resolve_embedding, resolve_llm

runner = CliRunner()
TINY = Path(__file__).parent / "data" / "tiny-beir"


class _Models(BaseHTTPRequestHandler):
    """Answers ``GET /v1/models`` with two models and ``POST /v1/chat/completions`` with
    a passage; records the headers of every request and the body of every completion."""

    seen: list[dict[str, str]] = []
    completions: list[dict[str, Any]] = []

    def do_GET(self) -> None:
        type(self).seen.append(dict(self.headers))
        body = json.dumps({"object": "list", "data": [{"id": "first-7b"}, {"id": "second"}]})
        self._reply(200 if self.path == "/v1/models" else 404, body)

    def do_POST(self) -> None:
        type(self).seen.append(dict(self.headers))
        asked = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).completions.append(asked)
        if self.headers.get("Authorization") == "Bearer sk-refused-55":
            self._reply(401, json.dumps({"error": {"message": "Incorrect API key provided"}}))
            return
        message = {"role": "assistant", "content": "Revenue fell as renewals slipped."}
        body = json.dumps(
            {
                "id": "c1",
                "object": "chat.completion",
                "created": 0,
                "model": asked["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 9, "completion_tokens": 6, "total_tokens": 15},
            }
        )
        self._reply(200 if self.path == "/v1/chat/completions" else 404, body)

    def _reply(self, status: int, body: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body.encode())))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def models_server() -> Iterator[str]:
    _Models.seen, _Models.completions = [], []
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


def test_llm_model_and_llm_key_win_over_the_environment(
    models_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HYDE_PLUS_LLM_MODEL", "first-7b")
    monkeypatch.setenv("HYDE_PLUS_LLM_API_KEY", "env-key")
    llm = resolve_llm(models_server, server_model="second", server_key="option-key")
    assert llm.model == "second" and llm.api_key == "option-key"  # type: ignore[attr-defined]


def test_the_cli_sends_the_named_model_and_key_and_never_shows_the_key(
    models_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HYDE_PLUS_LLM_MODEL", "first-7b")
    monkeypatch.delenv("HYDE_PLUS_LLM_API_KEY", raising=False)
    secret = "sk-cli-secret-4242"
    result = runner.invoke(
        app,
        [
            *("transform", "Why did revenue drop?", "--method", "hyde", "--llm", models_server),
            *("--llm-model", "second", "--llm-key", secret),
        ],
    )
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["fallback"] is False and "renewals slipped" in json.dumps(shown)
    assert [c["model"] for c in _Models.completions] == ["second"]
    assert _Models.seen[-1]["Authorization"] == f"Bearer {secret}"
    assert secret not in result.output


def test_without_a_name_the_cli_asks_the_server_for_its_first_model(
    models_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HYDE_PLUS_LLM_MODEL", raising=False)
    result = runner.invoke(app, ["transform", "q", "--method", "hyde", "--llm", models_server])
    assert result.exit_code == 0, result.output
    assert [c["model"] for c in _Models.completions] == ["first-7b"]


def test_a_refused_key_falls_back_and_is_never_shown(
    models_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HYDE_PLUS_LLM_MODEL", raising=False)
    args = ["transform", "q", "--method", "hyde", "--llm", models_server]
    result = runner.invoke(app, [*args, "--llm-key", "sk-refused-55"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert shown["fallback"] is True and "401" in shown["error"]
    assert "sk-refused-55" not in result.output


def test_serve_names_its_server_without_the_password_in_its_address(
    models_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HYDE_PLUS_LLM_MODEL", raising=False)
    address = models_server.replace("http://", "http://user:pw-secret-31@")
    result = runner.invoke(app, ["serve", "--stdio", "--llm", address], input="")
    assert result.exit_code == 0, result.output
    assert "first-7b (http://***@127.0.0.1" in result.output
    assert "pw-secret-31" not in result.output


def test_the_llm_key_is_hidden_in_a_recorded_command_line() -> None:
    from llama_index_hyde_plus._redact import redact_argv

    shown = redact_argv(["eval", "--llm-key", "k1", "--llm-key=k2", "--llm-model", "m"])
    assert shown == ["eval", "--llm-key", "***", "--llm-key=***", "--llm-model", "m"]


@pytest.mark.parametrize(
    ("command", "extra"),
    [
        (["query", "q", "--index", "IDX"], []),
        (["transform", "q"], []),
        (["serve", "--stdio"], []),
        (["eval", "--dataset", str(TINY)], ["--out", "OUT"]),
        (["tune", "--dataset", str(TINY)], ["--out", "OUT/t.json"]),
    ],
)
@pytest.mark.parametrize("llm", ["local", "openai:gpt-4o-mini", "scripted", "oracle:0.5"])
def test_a_server_option_without_a_server_is_refused_before_anything_loads(
    tmp_path: Path, command: list[str], extra: list[str], llm: str
) -> None:
    if llm.startswith("oracle") and command[0] not in ("eval", "tune"):
        return  # only eval and tune know the stand-in
    args = [a.replace("IDX", str(tmp_path)).replace("OUT", str(tmp_path / "o")) for a in command]
    args += [a.replace("OUT", str(tmp_path / "o")) for a in extra]
    result = runner.invoke(app, [*args, "--llm", llm, "--llm-model", "m", "--llm-key", "sk-x9"])
    assert result.exit_code == 2, result.output
    assert "--llm-model and --llm-key: only for a server" in result.output
    assert "sk-x9" not in result.output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("model", "key", "message"),
    [
        ("", None, "--llm-model must be printable text"),
        ("  ", None, "--llm-model must be printable text"),
        ("a\nb", None, "--llm-model must be printable text"),
        (None, "", "--llm-key must be printable text"),
        (None, "sk-\x00zz", "--llm-key must be printable text"),
        (None, "sk-\u00e9t\u00e9", "--llm-key must be ASCII"),
        ("other", None, "names the model already"),
    ],
)
def test_a_bad_server_model_or_key_is_named_without_showing_the_key(
    model: str | None, key: str | None, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OLLAMA_HOST", "127.0.0.1:9")
    spec = "ollama:qwen2.5:7b" if model == "other" else "http://127.0.0.1:9/v1"
    with pytest.raises(ValueError, match=message) as raised:
        resolve_llm(spec, server_model=model, server_key=key)
    assert not key or key not in str(raised.value)


def test_ollama_is_its_openai_compatible_endpoint(
    models_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HYDE_PLUS_LLM_MODEL", raising=False)
    monkeypatch.setenv("OLLAMA_HOST", models_server.removesuffix("/v1"))
    llm = resolve_llm("ollama:qwen2.5:7b")
    assert type(llm).__name__ == "OpenAILike"
    assert llm.model == "qwen2.5:7b" and llm.api_base == models_server  # type: ignore[attr-defined]
    assert resolve_llm("Ollama").model == "first-7b"  # type: ignore[attr-defined]
    result = runner.invoke(app, ["transform", "q", "--method", "hyde", "--llm", "ollama:tiny"])
    assert result.exit_code == 0 and json.loads(result.output)["fallback"] is False
    assert _Models.completions[-1]["model"] == "tiny"


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("", "http://localhost:11434/v1"),
        ("0.0.0.0", "http://localhost:11434/v1"),
        ("gpu-box:8000", "http://gpu-box:8000/v1"),
        ("https://ollama.example", "https://ollama.example:443/v1"),
        ("http://10.0.0.5", "http://10.0.0.5:80/v1"),
        ("[::1]:9", "http://[::1]:9/v1"),
    ],
)
def test_ollama_host_is_read_as_ollama_reads_it(
    host: str, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OLLAMA_HOST", host)
    assert read_llm_spec("ollama:m") == LlmSpec("server", url, model="m")


@pytest.mark.parametrize("host", ["box:port", "ftp://box", "http://:80"])
def test_a_bad_ollama_host_is_named(host: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OLLAMA_HOST", host)
    with pytest.raises(ValueError, match=r"OLLAMA_HOST=.* is not a host"):
        read_llm_spec("ollama")


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
        ("claude", "use auto, local, openai[:MODEL], PATH.gguf, http://HOST:PORT/v1 or ollama"),
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
    if which == "server":  # a local server reads no key; it is sent and never shown
        common += ["--llm-key", "sk-never-shown-77"]
    common += ["--max-tokens", "48", "--concurrency", "2", "--timeout", "120"]
    evaluated = runner.invoke(
        app,
        [
            *("eval", "--dataset", str(TINY), "--split", "test", "--transforms", "none,hyde"),
            *("--out", str(tmp_path / "out"), *common),
        ],
    )
    assert evaluated.exit_code == 0, evaluated.output
    assert "sk-never-shown-77" not in evaluated.output
    assert "sk-never-shown-77" not in (tmp_path / "out" / "results.md").read_text()
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
            *("query", "what is measured?", "--index", str(index), "-t", "hyde"),
            *("--json", "--llm", llm, "--timeout", "120"),
            *(["--llm-model", "SmolLM2-135M-Instruct.Q4_1.gguf"] if which == "server" else []),
        ],
    )
    assert queried.exit_code == 0, queried.output
    shown = json.loads(queried.stdout)
    assert shown["transform"]["fallback"] is False, shown["transform"]
