"""Check a built wheel and sdist before a release (run by `.ci/release`).

Usage: python .ci/check_dist.py DIST_DIR PYPROJECT

Reads each archive's metadata with the standard library (no build tool imported) and
checks it against pyproject.toml: the name, the version (also the one
``llama_index_hyde_plus/_version.py`` reports), requires-python, the extras, the
license, the README as the long description (declared as Markdown; a warning for
relative links, which a package index shows broken), and the files a user needs (the
package, ``py.typed``, the demo corpus; no dataset file). Prints one line per check;
exits 1 naming every failure.
"""

from __future__ import annotations

import email.parser
import email.policy
import re
import sys
import tarfile
import zipfile
from email.message import Message
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the TOML reader pip carries
    from pip._vendor import tomli as tomllib  # type: ignore[no-redef]

EXTRAS = ("cli", "server", "local", "eval")
"""The extras a user is told to install: each must be in both archives' metadata."""

PACKAGE = "llama_index_hyde_plus"


def _parse(text: str) -> Message:
    return email.parser.Parser(policy=email.policy.compat32).parsestr(text)


def wheel_files(wheel: Path) -> tuple[Message, list[str]]:
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
        return _parse(z.read(meta).decode("utf-8")), names


def sdist_files(sdist: Path) -> tuple[Message, list[str]]:
    with tarfile.open(sdist) as t:
        names = [m.name.split("/", 1)[1] for m in t.getmembers() if "/" in m.name]
        top = t.getmembers()[0].name.split("/", 1)[0]
        pkg_info = t.extractfile(f"{top}/PKG-INFO")
        assert pkg_info is not None
        return _parse(pkg_info.read().decode("utf-8")), names


def check_metadata(kind: str, meta: Message, project: dict, readme: str) -> list[str]:
    """The failures of one archive's metadata against ``project`` (pyproject's table)."""
    failures = []
    expect = {
        "Name": project["name"],
        "Version": project["version"],
        "Requires-Python": project["requires-python"],
        "License-Expression": project["license"],
        "Description-Content-Type": "text/markdown",
    }
    for field, wanted in expect.items():
        got = meta.get(field)
        if got != wanted:
            failures.append(f"{kind}: {field} is {got!r}, pyproject says {wanted!r}")
    extras = set(meta.get_all("Provides-Extra") or [])
    missing = [e for e in EXTRAS if e not in extras]
    if missing:
        failures.append(f"{kind}: extras missing from the metadata: {', '.join(missing)}")
    body = meta.get_payload()
    if not isinstance(body, str) or body.strip() != readme.strip():
        failures.append(f"{kind}: the long description is not the README")
    return failures


def relative_links(readme: str) -> list[str]:
    """Links and images to a relative path: they render, but a package index shows them
    broken (the project has no published URL yet to make them absolute)."""
    return [
        target
        for target in re.findall(r"\]\(([^)\s]+)", readme)
        if not target.startswith(("http://", "https://", "#", "mailto:"))
    ]


def check_files(kind: str, names: list[str]) -> list[str]:
    wanted = [f"{PACKAGE}/__init__.py", f"{PACKAGE}/py.typed", f"{PACKAGE}/data/demo_corpus.jsonl"]
    failures = [f"{kind}: {w} is missing" for w in wanted if not any(n.endswith(w) for n in names)]
    leaked = [n for n in names if "scifact" in n.lower() and n.endswith((".jsonl", ".tsv"))]
    failures += [f"{kind}: a dataset file is packaged: {n}" for n in leaked]
    return failures


def main(dist: Path, pyproject: Path) -> int:
    project = tomllib.loads(pyproject.read_text())["project"]
    readme = (pyproject.parent / project["readme"]).read_text()
    version_file = (pyproject.parent / PACKAGE / "_version.py").read_text()
    failures = []
    if f'__version__ = "{project["version"]}"' not in version_file:
        failures.append(f"{PACKAGE}/_version.py does not say {project['version']}")
    wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        failures.append(
            f"expected one wheel and one sdist in {dist}, found {len(wheels)} + {len(sdists)}"
        )
        print("\n".join(f"FAIL {f}" for f in failures))
        return 1
    for kind, (meta, names) in (
        (wheels[0].name, wheel_files(wheels[0])),
        (sdists[0].name, sdist_files(sdists[0])),
    ):
        found = check_metadata(kind, meta, project, readme) + check_files(kind, names)
        failures += found
        said = f"{kind}: {len(names)} files, metadata {meta['Name']} {meta['Version']}"
        print(f"{'FAIL' if found else 'ok  '} {said}")
    relative = relative_links(readme)
    if relative:
        print(
            f"warn README: {len(relative)} relative links, broken on a package index "
            f"({', '.join(relative[:3])}...)"
        )
    for failure in failures:
        print(f"FAIL {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
