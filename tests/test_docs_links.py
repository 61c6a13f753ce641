"""The documentation holds together: every relative link and image in README.md and docs/*.md names a file that
exists, every ``#anchor`` matches a heading of its page by GitHub's slug, and README.md stays a short front door
(under 12 KB). tests/test_docs_site.py also builds docs/ with MkDocs --strict; this check needs no MkDocs and
covers the README, which the site leaves out."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_LIMIT = 12 * 1024  # bytes

FENCE = re.compile(r"^```.*?^```[ \t]*$", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text without markup, lower case, punctuation but ``-`` and ``_`` dropped,
    spaces as ``-``."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of a page's headings, repeats numbered as GitHub does (``x``, ``x-1``, ``x-2``)."""
    seen: dict[str, int] = {}
    out = set()
    for _, title in HEADING.findall(FENCE.sub("", text)):
        s = slug(title)
        n = seen.get(s, 0)
        out.add(s if n == 0 else f"{s}-{n}")
        seen[s] = n + 1
    return out


def links(text: str) -> list[str]:
    """The targets of a page's links and images, outside code."""
    prose = INLINE_CODE.sub("", FENCE.sub("", text))
    return LINK.findall(prose)


def broken(page: Path) -> list[str]:
    """Each relative link of ``page`` whose file is missing or whose anchor names no heading."""
    out = []
    for target in links(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...: not this repository's
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            out.append(f"{page.name}: {target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text(encoding="utf-8")):
            out.append(f"{page.name}: {target}: no heading with that anchor in {dest.name}")
    return out


def test_slugs_as_github_makes_them() -> None:
    assert slug("Serving engines (`deployment.engine`)") == "serving-engines-deploymentengine"
    assert slug("Prefill/decode disaggregation") == "prefilldecode-disaggregation"
    assert slug("Request classes (`workload.classes`)") == "request-classes-workloadclasses"
    assert slug("Capacity planning and `plan`") == "capacity-planning-and-plan"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n") == {"a", "a-1"}


def test_the_checker_finds_a_broken_link(tmp_path: Path) -> None:
    (tmp_path / "b.md").write_text("# B\n\n## Has anchor\n")
    page = tmp_path / "a.md"
    page.write_text("# A\n[ok](b.md#has-anchor) [self](#a) [web](https://example.com/x)\n"
                    "`[in code](gone.md)`\n```\n[in a block](gone.md)\n```\n"
                    "[missing](gone.md) [bad anchor](b.md#nope) ![img](nope.png)\n")
    assert broken(page) == ["a.md: gone.md: no such file", "a.md: b.md#nope: no heading with that anchor in b.md",
                            "a.md: nope.png: no such file"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page: Path) -> None:
    assert not broken(page), "\n".join(broken(page))


def test_the_readme_is_a_short_front_door() -> None:
    size = len((ROOT / "README.md").read_bytes())
    assert size < README_LIMIT, f"README.md is {size:,} bytes; move detail to a page of docs/ (limit {README_LIMIT:,})"


def test_every_docs_page_is_linked_from_the_readme() -> None:
    """A page nobody links to is a page nobody finds."""
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in links((ROOT / "README.md").read_text(encoding="utf-8"))}
    orphans = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert not orphans, orphans


def layout_paths(page: str) -> list[str]:
    """The repository paths that docs/ARCHITECTURE.md's Layout table names: those in full (sim/..., realengine/...)
    and a row's short names (`runner.py`, `loop/executor.py`), read in the folder of the row's first full path."""
    table = page.split("## Layout", 1)[1].split("\n\n", 2)[2].split("\n\n", 1)[0]
    paths = []
    for row in table.splitlines():
        names = re.findall(r"`([\w/][\w/.]*)`", row)
        full = [n for n in names if re.match(r"(?:sim|realengine|calibration|notebooks|benchmarks)/", n)]
        folder = re.sub(r"[^/]*$", "", full[0]) if full else ""  # realengine/ of realengine/ and of realengine/x.py
        paths += [n if n in full else folder + n for n in names if n in full or folder and n.endswith((".py", "/"))]
    return paths


def test_the_architecture_layout_names_only_files_that_exist() -> None:
    """The Layout table lists the main modules, not every one (its intro says so): what it names must exist, so
    that a module moved or renamed does not leave a row behind."""
    named = layout_paths((ROOT / "docs" / "ARCHITECTURE.md").read_text())
    assert "sim/costs/energy.py" in named and len(named) > 50
    assert [p for p in named if not (ROOT / p).exists()] == []
    assert layout_paths("## Layout\n\nintro\n\n| `sim/gone.py` | x |\n\nafter `sim/elsewhere.py`") == ["sim/gone.py"]
    assert layout_paths("## Layout\n\ni\n\n| `realengine/` | `loop/executor.py`, `kv_leak` |") == [  # the
        "realengine/", "realengine/loop/executor.py"]  # EngineExecutor's row named a realengine/loop/ never there
