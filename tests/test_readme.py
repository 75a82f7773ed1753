"""Every ```python block of README.md, run as written, in order, in one namespace.

A reader pastes the blocks one after another, so later blocks use names that earlier
ones define (`index`, `retriever`, `llm`, `embed_model`, `documents`...). What this test
adds to the README's own text, and nothing else:

- **The README's "No API key?" swap** (under *Quickstart*), applied literally:
  ``from llama_index_hyde_plus.local import local_llm, local_embedding`` and
  ``Settings.llm = local_llm(); Settings.embed_model = local_embedding()`` before the
  first block, then in each block ``OpenAI(model="...")`` -> ``local_llm()``,
  ``OpenAIEmbedding(model="...")`` -> ``local_embedding()`` and a model name
  (``hyde_model="..."``, ``answer_model="..."``) -> ``"local"`` (`SWAP`).
  ``OPENAI_API_KEY`` is unset, so anything the swap misses fails loudly.
- **What the README's shell commands make**, in a temporary working directory, built
  only when a block names it: ``my-index`` (``hyde-plus index ./handbook --out
  my-index``) and ``./hybrid.db`` (``hyde-plus index DOCS --store milvus --uri
  ./hybrid.db``), both over a small handbook (`HANDBOOK`) with ``--embed local``.
- **The RCP server the client block talks to**: ``hyde-plus serve --index my-index
  --http 0 --llm scripted`` on loopback, its URL in place of
  ``http://127.0.0.1:8000/rcp``.

A block right after ``<!-- not run: REASON -->`` is skipped with that reason. Bash blocks
are not run. Each block is one test, named after the heading above it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .conftest import Served

pytest.importorskip("xllamacpp")  # the swap needs the `local` extra

README = Path(__file__).parent.parent / "README.md"

SWAP_PRELUDE = (
    "from llama_index.core import Settings\n"
    "from llama_index_hyde_plus.local import local_llm, local_embedding\n"
    "Settings.llm = local_llm()\n"
    "Settings.embed_model = local_embedding()\n"
)
SWAP = [
    (re.compile(r'\bOpenAI\(model="[^"]*"\)'), "local_llm()"),
    (re.compile(r'\bOpenAIEmbedding\(model="[^"]*"\)'), "local_embedding()"),
    (re.compile(r'\b(hyde_model|answer_model)="[^"]*"'), r'\1="local"'),
]
README_URL = "http://127.0.0.1:8000/rcp"

HANDBOOK = {
    "backup.txt": "The nightly backup window closes at 04:00 UTC, after the full backup.",
    "pto.txt": "Employees receive twenty five days of paid time off each year.",
    "revenue.md": "# Q3 review\n\nEnterprise renewals slipped last quarter as large "
    "accounts delayed signing.\n",
}


@dataclass(frozen=True)
class Block:
    id: str
    line: int  # of the first code line in README.md
    code: str
    not_run: str | None


def _slug(heading: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", heading.lower()).strip("-") or "top"


def readme_blocks(text: str) -> list[Block]:
    """The ```python blocks of ``text``, each named ``<nearest heading>-<n>``."""
    blocks: list[Block] = []
    lines = text.splitlines()
    heading, count, previous = "top", 0, ""
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            start, lang = i + 1, line[3:].strip()
            i += 1
            while i < len(lines) and lines[i].strip() != "```":
                i += 1
            if lang == "python":
                count += 1
                mark = re.fullmatch(r"<!--\s*not run:\s*(.*?)\s*-->", previous.strip())
                code = "\n".join(lines[start:i]) + "\n"
                blocks.append(
                    Block(f"{heading}-{count}", start + 1, code, mark.group(1) if mark else None)
                )
        elif line.startswith("#"):
            heading, count = _slug(line.lstrip("#")), 0
        if line.strip():
            previous = line
        i += 1
    return blocks


BLOCKS = readme_blocks(README.read_text())


def swapped(code: str) -> str:
    for pattern, replacement in SWAP:
        code = pattern.sub(replacement, code)
    return code


class Reader:
    """Runs the blocks in README order in one namespace, in a working directory that
    holds what the README's shell commands would have made."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.namespace: dict[str, Any] = {"__name__": "__readme__"}
        self.outcomes: list[BaseException | None] = []
        self.server: Served | None = None
        exec(SWAP_PRELUDE, self.namespace)

    def _cli(self, *args: str) -> None:
        from typer.testing import CliRunner

        from llama_index_hyde_plus.cli import app

        result = CliRunner().invoke(app, list(args))
        assert result.exit_code == 0, result.output

    def _handbook(self) -> str:
        folder = self.workdir / "handbook"
        if not folder.exists():
            folder.mkdir()
            for name, text in HANDBOOK.items():
                (folder / name).write_text(text)
        return str(folder)

    def _needs(self, code: str) -> str:
        """Make what ``code`` opens; return it with the server's URL in place."""
        if ("my-index" in code or README_URL in code) and not Path("my-index").exists():
            self._cli("index", self._handbook(), "--out", "my-index", "--embed", "local")
        if "hybrid.db" in code and not Path("hybrid.db").exists():
            args = ("--store", "milvus", "--uri", "./hybrid.db", "--embed", "local")
            self._cli("index", self._handbook(), *args)
        if README_URL in code:
            if self.server is None:
                self.server = Served("--index", "my-index", "--llm", "scripted")
            code = code.replace(README_URL, self.server.url)
        return code

    def run_through(self, n: int) -> None:
        while len(self.outcomes) <= n:
            block = BLOCKS[len(self.outcomes)]
            outcome: BaseException | None = None
            if block.not_run is None:
                try:
                    code = self._needs(swapped(block.code))
                    left = re.findall(r"\bOpenAI(?:Embedding)?\([^)]*\)", code)
                    assert not left, f"the README's no-key swap does not cover {left}"
                    # padded so tracebacks name the README's own line numbers
                    padded = "\n" * (block.line - 1) + code
                    exec(compile(padded, str(README), "exec"), self.namespace)
                except BaseException as exc:  # reported by the block's own test
                    outcome = exc
            self.outcomes.append(outcome)

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
        self.namespace.clear()  # the blocks' models and indexes


@pytest.fixture(scope="module")
def reader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Reader]:
    from llama_index.core import Settings

    saved = (Settings._llm, Settings._embed_model, Settings._callback_manager)
    workdir = tmp_path_factory.mktemp("readme")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("OPENAI_API_KEY", raising=False)
        mp.chdir(workdir)
        r = Reader(workdir)
        try:
            yield r
        finally:
            r.close()
            Settings._llm, Settings._embed_model, Settings._callback_manager = saved


def test_the_readme_has_python_blocks_and_a_no_key_swap() -> None:
    assert BLOCKS  # the example; the docs pages' blocks run in test_docs_examples.py
    text = README.read_text()
    assert "from llama_index_hyde_plus.local import local_llm, local_embedding" in text
    assert (
        "Settings.llm = local_llm()" in text and "Settings.embed_model = local_embedding()" in text
    )


def test_blocks_are_named_by_heading_and_carry_their_not_run_reason() -> None:
    text = (
        "# Title\n```python\na = 1\n```\n## Some Section\n```bash\nls\n```\n"
        "```python\nb = a\n```\n\n<!-- not run: needs a cluster -->\n```python\nc = 3\n```\n"
    )
    blocks = readme_blocks(text)
    assert [(b.id, b.line, b.code, b.not_run) for b in blocks] == [
        ("title-1", 3, "a = 1\n", None),
        ("some-section-1", 10, "b = a\n", None),
        ("some-section-2", 15, "c = 3\n", "needs a cluster"),
    ]


def test_the_swap_is_the_readmes_own() -> None:
    code = (
        'HyDE(OpenAI(model="gpt-4o-mini"))\ne = OpenAIEmbedding(model="x")\nf(hyde_model="gpt-4o")'
    )
    assert swapped(code) == 'HyDE(local_llm())\ne = local_embedding()\nf(hyde_model="local")'


@pytest.mark.parametrize("n", range(len(BLOCKS)), ids=[b.id for b in BLOCKS])
def test_readme_block(reader: Reader, n: int) -> None:
    block = BLOCKS[n]
    if block.not_run is not None:
        pytest.skip(f"README.md:{block.line}: not run: {block.not_run}")
    reader.run_through(n)
    failed = reader.outcomes[n]
    if failed is None:
        return
    earlier = [BLOCKS[i].id for i in range(n) if reader.outcomes[i] is not None]
    if earlier:
        pytest.fail(f"{block.id} (README.md:{block.line}) failed after {earlier} did: {failed!r}")
    raise failed
