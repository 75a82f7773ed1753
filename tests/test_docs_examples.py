"""Every ```python block of every page under docs/, run in order, one namespace per page.

A reader pastes a page's blocks one after another, so later blocks use names earlier
ones define. What this test adds to the pages' own text, and nothing else:

- **Doubles for the models**, so the whole file runs in seconds: before a page's first
  block ``Settings.llm = echo_llm()`` and ``Settings.embed_model =
  DeterministicEmbedding()`` (`llama_index_hyde_plus.testing`), then in each block
  a ``FunctionAgent``'s ``llm=OpenAI(model="...")`` -> ``agent_llm()`` (it calls the
  agent's tools), other ``OpenAI(model="...")`` and ``local_llm()`` -> ``echo_llm()``,
  ``OpenAIEmbedding(model="...")`` and ``local_embedding()`` ->
  ``DeterministicEmbedding()`` (`SWAP`). ``OPENAI_API_KEY`` is unset, so anything the swap misses fails loudly.
- **What the pages' shell commands make**, in a temporary working directory shared by
  the pages, built only when a block names it: ``my-index`` (``hyde-plus index ./handbook
  --out my-index``) and ``./hybrid.db`` (``--store milvus``), both over a three-file
  handbook with ``--embed local`` (the CLI has no double for embeddings).
- **The RCP server an HTTP client block talks to**: what ``hyde-plus serve --index
  my-index --http 0 --llm scripted`` serves, run in this process (a subprocess would
  spend most of this file's time starting), its URL in place of
  ``http://127.0.0.1:8000/rcp``.

A block right after ``<!-- not run: REASON -->`` is skipped with that reason. Each block
is one test, named ``<page>-<heading>-<n>``. Pages whose name starts with ``_`` (drafts)
are not part of the site and not run.
"""

from __future__ import annotations

import inspect
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from llama_index_hyde_plus.server.http import RcpHttpServer


DOCS = Path(__file__).parent.parent / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if not p.name.startswith("_"))

PRELUDE = (
    "from llama_index.core import Settings\n"
    "from llama_index_hyde_plus.testing import DeterministicEmbedding, agent_llm, echo_llm\n"
    "Settings.llm = echo_llm()\n"
    "Settings.embed_model = DeterministicEmbedding()\n"
)
SWAP = [
    (re.compile(r'(\bFunctionAgent\([^)]*llm=)OpenAI\(model="[^"]*"\)'), r"\1agent_llm()"),
    (re.compile(r'\bOpenAI\(model="[^"]*"\)'), "echo_llm()"),
    (re.compile(r'\bOpenAIEmbedding\(model="[^"]*"\)'), "DeterministicEmbedding()"),
    (re.compile(r"\blocal_llm\(\)"), "echo_llm()"),
    (re.compile(r"\blocal_embedding\(\)"), "DeterministicEmbedding()"),
]
SERVER_URL = "http://127.0.0.1:8000/rcp"
HANDBOOK = {
    "backup.txt": "The nightly backup window closes at 04:00 UTC, after the full backup.",
    "pto.txt": "Employees receive twenty five days of paid time off each year.",
    "revenue.md": "# Q3 review\n\nEnterprise renewals slipped last quarter as large "
    "accounts delayed signing.\n",
}


def _serve(index: str) -> RcpHttpServer:
    """``hyde-plus serve --index INDEX --http 0 --llm scripted``, in a background thread."""
    from llama_index_hyde_plus.server.http import RcpHttpServer
    from llama_index_hyde_plus.server.rcp import MAX_K, TransformService, build_server
    from llama_index_hyde_plus.stores import open_store
    from llama_index_hyde_plus.testing import echo_llm

    store = open_store(index=Path(index))
    service = TransformService(echo_llm(), store.open(MAX_K), modes=store.modes)
    return RcpHttpServer(build_server(service, http=True)).start()


@dataclass(frozen=True)
class Block:
    page: Path
    id: str
    line: int  # of the first code line in the page
    code: str
    not_run: str | None


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "top"


def page_blocks(page: Path, text: str) -> list[Block]:
    """The ```python blocks of ``text``, each named ``<page>-<nearest heading>-<n>``."""
    name = _slug(str(page.relative_to(DOCS).with_suffix(""))) if page.is_absolute() else "p"
    blocks: list[Block] = []
    lines = text.splitlines()
    heading, count, previous, i = "top", 0, "", 0
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
                    Block(
                        page,
                        f"{name}-{heading}-{count}",
                        start + 1,
                        code,
                        mark.group(1) if mark else None,
                    )
                )
        elif line.startswith("#"):
            heading, count = _slug(line.lstrip("#")), 0
        if line.strip():
            previous = line
        i += 1
    return blocks


BLOCKS = [b for page in PAGES for b in page_blocks(page, page.read_text())]


def swapped(code: str) -> str:
    for pattern, replacement in SWAP:
        code = pattern.sub(replacement, code)
    return code


def _settings() -> tuple[Any, Any, Any]:
    from llama_index.core import Settings

    return Settings._llm, Settings._embed_model, Settings._callback_manager


@dataclass
class PageRun:
    namespace: dict[str, Any]
    settings: tuple[Any, Any, Any] = (None, None, None)
    outcomes: list[BaseException | None] = field(default_factory=list)


class Reader:
    """Runs each page's blocks in order in the page's own namespace, in a working
    directory holding what the pages' shell commands would have made."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.pages: dict[Path, PageRun] = {}
        self.server: RcpHttpServer | None = None

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
        if ("my-index" in code or SERVER_URL in code) and not Path("my-index").exists():
            self._cli("index", self._handbook(), "--out", "my-index", "--embed", "local")
        if "hybrid.db" in code and not Path("hybrid.db").exists():
            args = ("--store", "milvus", "--uri", "./hybrid.db", "--embed", "local")
            self._cli("index", self._handbook(), *args)
        if SERVER_URL in code:
            if self.server is None:
                self.server = _serve("my-index")
            code = code.replace(SERVER_URL, self.server.url)
        return code

    def _page(self, page: Path) -> PageRun:
        run = self.pages.get(page)
        if run is None:
            run = self.pages[page] = PageRun({"__name__": f"__docs_{page.stem}__"})
            exec(PRELUDE, run.namespace)
            run.settings = _settings()
        return run

    def run_through(self, block: Block) -> BaseException | None:
        """Run the page's blocks up to ``block``; its outcome (None when it passed)."""
        from llama_index.core import Settings

        mine = [b for b in BLOCKS if b.page == block.page]
        run = self._page(block.page)
        while len(run.outcomes) <= mine.index(block):
            todo = mine[len(run.outcomes)]
            outcome: BaseException | None = None
            if todo.not_run is None:
                try:
                    code = self._needs(swapped(todo.code))
                    left = re.findall(r"\bOpenAI(?:Embedding)?\([^)]*\)", code)
                    assert not left, f"the docs' test swap does not cover {left}"
                    # padded so tracebacks name the page's own line numbers
                    padded = "\n" * (todo.line - 1) + code
                    # each page's own Settings, as its earlier blocks left them
                    Settings._llm, Settings._embed_model, Settings._callback_manager = run.settings
                    try:
                        exec(compile(padded, str(todo.page), "exec"), run.namespace)
                    finally:
                        run.settings = _settings()
                except BaseException as exc:  # reported by the block's own test
                    outcome = exc
            run.outcomes.append(outcome)
        return run.outcomes[mine.index(block)]

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
        self.pages.clear()  # the blocks' models and indexes


@pytest.fixture(scope="module")
def reader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Reader]:
    from llama_index.core import Settings

    saved = (Settings._llm, Settings._embed_model, Settings._callback_manager)
    workdir = tmp_path_factory.mktemp("docs")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("OPENAI_API_KEY", raising=False)
        # `hyde-plus` (the stdio client block starts it) from this interpreter's env
        mp.setenv("PATH", str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
        mp.chdir(workdir)
        r = Reader(workdir)
        try:
            yield r
        finally:
            r.close()
            Settings._llm, Settings._embed_model, Settings._callback_manager = saved


def test_every_user_page_has_runnable_python_blocks() -> None:
    assert len(PAGES) >= 16
    ran = [b for b in BLOCKS if b.not_run is None]
    assert len(ran) >= 25
    skipped = [b.id for b in BLOCKS if b.not_run is not None]
    assert len(skipped) <= 3, f"keep `not run` rare: {skipped}"


def test_blocks_are_named_by_page_and_heading_and_carry_their_not_run_reason() -> None:
    text = (
        "# Title\n```python\na = 1\n```\n## Some Section\n```bash\nls\n```\n"
        "```python\nb = a\n```\n\n<!-- not run: needs a cluster -->\n```python\nc = 3\n```\n"
    )
    blocks = page_blocks(DOCS / "guide" / "page.md", text)
    assert [(b.id, b.line, b.code, b.not_run) for b in blocks] == [
        ("guide-page-title-1", 3, "a = 1\n", None),
        ("guide-page-some-section-1", 10, "b = a\n", None),
        ("guide-page-some-section-2", 15, "c = 3\n", "needs a cluster"),
    ]


def test_the_swap_puts_doubles_in_place_of_real_models() -> None:
    code = (
        'HyDE(OpenAI(model="gpt-4o-mini"))\ne = OpenAIEmbedding(model="x")\n'
        "l = local_llm(); m = local_embedding()"
    )
    assert swapped(code) == (
        "HyDE(echo_llm())\ne = DeterministicEmbedding()\n"
        "l = echo_llm(); m = DeterministicEmbedding()"
    )
    agent = 'FunctionAgent(tools=[search], llm=OpenAI(model="gpt-4o"))'
    assert swapped(agent) == "FunctionAgent(tools=[search], llm=agent_llm())"


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_docs_block(reader: Reader, block: Block) -> None:
    where = f"{block.page.relative_to(DOCS.parent)}:{block.line}"
    if block.not_run is not None:
        pytest.skip(f"{where}: not run: {block.not_run}")
    failed = reader.run_through(block)
    if failed is None:
        return
    mine = [b for b in BLOCKS if b.page == block.page]
    outcomes = reader.pages[block.page].outcomes
    earlier = [b.id for b, o in zip(mine, outcomes) if o is not None and b != block]
    if earlier:
        pytest.fail(f"{block.id} ({where}) failed after {earlier} did: {failed!r}")
    raise failed


def curl_calls(text: str) -> list[tuple[str, dict[str, str], str]]:
    """``(url, headers, body)`` of every ``curl`` in the bash block after ``<!-- curl -->``."""
    import shlex

    block = text.split("<!-- curl -->", 1)[1].split("```bash\n", 1)[1].split("\n```", 1)[0]
    calls = []
    for line in block.replace("\\\n", " ").splitlines():
        if not line.startswith("curl "):
            continue
        args = shlex.split(line)
        url = next(a for a in args if a.startswith("http"))
        headers = dict(args[i + 1].split(": ", 1) for i, a in enumerate(args) if a == "-H")
        calls.append((url, headers, args[args.index("-d") + 1]))
    return calls


def test_the_rcp_pages_curl_example_works_against_the_server(reader: Reader) -> None:
    import json
    import urllib.request

    calls = curl_calls((DOCS / "rcp.md").read_text())
    assert [json.loads(body)["method"] for _, _, body in calls] == [
        "initialize",
        "query/transform",
        "retrieve",
    ]
    reader._needs(SERVER_URL)  # the index and the server the page's blocks use
    assert reader.server is not None
    for url, headers, body in calls:
        assert url == SERVER_URL
        request = urllib.request.Request(
            reader.server.url, data=body.encode(), headers=headers, method="POST"
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            reply = json.loads(response.read())
        assert "result" in reply and "error" not in reply, (body, reply)
    assert reply["result"]["hits"] and reply["result"]["rewrite"]["method"] == "hyde"


# -- the API reference ------------------------------------------------------------------

API_PAGES = sorted((DOCS / "api").glob("*.md"))


def documented_names(pages: list[Path] = API_PAGES) -> set[str]:
    """Every ``::: llama_index_hyde_plus.NAME`` of the API reference ``pages``."""
    found: set[str] = set()
    for page in pages:
        found |= set(re.findall(r"^::: llama_index_hyde_plus\.(\S+)", page.read_text(), re.M))
    return found


def own_docstring(obj: Any) -> str:
    """``obj``'s own docstring: not a base class's, not a dataclass's generated signature,
    not Enum's "An enumeration."."""
    if inspect.isclass(obj):
        doc = obj.__dict__.get("__doc__") or ""
        if doc.startswith(obj.__name__ + "(") or doc.strip() == "An enumeration.":
            return ""
        return inspect.cleandoc(doc)
    return inspect.getdoc(obj) or ""


def test_every_public_name_is_in_the_api_reference_and_on_its_top_level_page() -> None:
    import llama_index_hyde_plus as package

    missing = sorted(set(package.__all__) - documented_names())
    assert not missing, f"add `::: llama_index_hyde_plus.NAME` to docs/api/: {missing}"
    top = DOCS / "api" / "index.md"
    assert "Everything in `llama_index_hyde_plus.__all__`" in top.read_text()
    elsewhere = sorted(set(package.__all__) - documented_names([top]))
    assert not elsewhere, f"the top-level page claims all of __all__; move there: {elsewhere}"


API_SECTIONS = {
    "Transforms": ("transforms",),
    "Retrieval": ("search", "provenance"),
    "Caches": ("caching",),
    "Usage and cost": ("usage",),
    "Two-stage RAG": ("pipeline",),
    "Indexes": ("stores",),
    "Chunking": ("chunking",),
    "Version": ("_version",),
}
"""Each heading of the top-level API reference and the modules its names come from."""


def test_the_api_reference_headings_match_what_is_under_them() -> None:
    import llama_index_hyde_plus as package

    heading, wrong = None, []
    for line in (DOCS / "api" / "index.md").read_text().splitlines():
        if line.startswith("## "):
            heading = line[3:].strip()
            assert heading in API_SECTIONS, f"a heading this test does not know: {heading}"
        elif line.startswith("::: llama_index_hyde_plus."):
            name = line.rsplit(".", 1)[1].strip()
            module = "_version" if name == "__version__" else getattr(package, name).__module__
            where = module.removeprefix("llama_index_hyde_plus.").split(".")[0]
            if heading is None or where not in API_SECTIONS[heading]:
                wrong.append(f"{name} ({module}) under {heading!r}")
    assert not wrong, wrong


def test_every_public_name_has_its_own_docstring() -> None:
    import llama_index_hyde_plus as package

    bare = [
        name
        for name in package.__all__
        if name != "__version__" and not own_docstring(getattr(package, name))
    ]
    assert not bare, f"public names without a docstring of their own: {bare}"


def test_own_docstring_ignores_inherited_and_generated_ones() -> None:
    import enum
    from dataclasses import dataclass as dc

    class Base:
        """Base."""

    class Child(Base):
        pass

    @dc
    class Point:
        x: int

    class Colour(enum.Enum):
        RED = 1

    def bare() -> None: ...

    assert own_docstring(Base) == "Base."
    assert [own_docstring(o) for o in (Child, Point, Colour, bare)] == ["", "", "", ""]


def test_the_install_section_says_which_extras_bring_the_command() -> None:
    """Each extra of pyproject.toml has a row in the home page's install table, whose
    last column says "yes" for `cli` and for the extras that include it, and says so."""
    import tomllib

    project = tomllib.loads((DOCS.parent / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    text = (DOCS / "index.md").read_text().split("## Install", 1)[1].split("\n## ", 1)[0]
    assert "\n| extra |" in text, "the install section has no table of the extras"
    table = text.split("\n| extra |", 1)[1].split("\n\n", 1)[0]
    rows = {}
    for line in table.splitlines()[2:]:  # after the header's end and the rule
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows[cells[0].strip("`")] = cells[2]
    assert set(rows) == set(extras), rows
    for extra, command in rows.items():
        includes = "llama-index-hyde-plus[cli]" in extras[extra]
        expected = "yes: includes `cli`" if includes else "yes" if extra == "cli" else "no"
        assert command == expected, (extra, command)


# -- the shell commands the pages show ---------------------------------------------------


def shown_commands(text: str) -> list[str]:
    """Every ``hyde-plus ...`` command a page shows: each line of its non-Python code
    blocks (a line ending in ``\\`` joined with the next) and each inline code span
    that holds one, from the command's name on, up to a pipe, ``&&``, ``;`` or a comment
    (``cd hyde-plus`` is a folder, not the command)."""
    shown: list[str] = []
    text = text.replace("\r\n", "\n")
    blocks = re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M)
    for language, body in blocks:
        if language != "python":
            shown += re.sub(r"\\\n\s*", " ", body).splitlines()
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    shown += re.findall(r"`([^`\n]*hyde-plus [^`\n]*)`", prose)
    commands = []
    for line in shown:
        line = re.split(r"(?:^|\s)#", line)[0]  # a shell comment
        found = re.search(r"(?:^|[\s/])hyde-plus\s+(.*)", line)
        if found and not re.search(r"\bcd\s+$", line[: found.start() + 1]):
            commands.append(re.split(r"\s(?:\||&&|;)(?:\s|$)", found.group(1))[0].strip())
    return [command for command in commands if command]


def unknown_options(command: str) -> list[str]:
    """The options ``command`` (``eval --docs d -t none``, what follows ``hyde-plus``)
    gives that its command does not have (``["-t"]``); the command itself when there is
    no such command. ``...`` (a placeholder) has none."""
    import shlex

    import typer.main

    from llama_index_hyde_plus.cli import app

    group: Any = typer.main.get_command(app)
    try:
        words = shlex.split(command)
    except ValueError as exc:  # an unclosed quote: no shell would run it either
        return [f"({exc})"]
    if not words or words[0] in ("...", "…") or words[0].startswith("-"):
        return []
    if words[0] not in group.commands:
        return [words[0]]
    found, rest = group.commands[words[0]], words[1:]
    if hasattr(found, "commands") and rest and rest[0] in found.commands:
        found, rest = found.commands[rest[0]], rest[1:]
    known = {"--help"}
    for param in found.params:
        known.update([*param.opts, *param.secondary_opts])
    given = [w.split("=", 1)[0] for w in rest if re.match(r"--?[A-Za-z]", w)]
    return [option for option in given if option not in known]


def test_every_command_the_pages_show_uses_only_that_commands_options() -> None:
    pages = [DOCS.parent / "README.md", *PAGES]
    checked, wrong = 0, []
    for page in pages:
        for command in shown_commands(page.read_text()):
            checked += 1
            wrong += [f"{page.name}: `hyde-plus {command}`: {o}" for o in unknown_options(command)]
    assert checked >= 50, checked  # the pages show commands: the parser found them
    assert not wrong, wrong


def test_a_shown_command_with_an_option_its_command_lacks_is_caught() -> None:
    page = (
        "Score it:\n\n```bash\nhyde-plus eval --docs ./docs \\\n    -t none,hyde\n```\n\n"
        "or `hyde-plus eval --docs d --transforms none,hyde:profile=small --nope 1`.\n"
    )
    found = [unknown_options(c) for c in shown_commands(page)]
    assert found == [["-t"], ["--nope"]]
    assert unknown_options("query 'q' --index my-index -t hyde") == []
    assert unknown_options("models pull --help") == []
    assert unknown_options("evaluate --docs d") == ["evaluate"]
    assert unknown_options('query "why --index i') == ["(No closing quotation)"]
    [crlf] = shown_commands("```bash\r\nhyde-plus eval \\\r\n  -t x\r\n```\r\n")
    assert unknown_options(crlf) == ["-t"]
