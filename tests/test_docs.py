"""The README and docs/ hold together: every relative link and #anchor resolves, the README stays a
front door, and no line speaks of who wrote it or when."""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
README_MAX_LINES = 320

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
LINK_DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
NARRATIVE = re.compile(r"\bstop \d+\b|\bof mine\b", re.IGNORECASE)


def documents() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


def prose_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of the lines outside fenced code blocks."""
    lines, fenced = [], None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        opening = FENCE.match(line)
        if opening:
            if fenced is None:
                fenced = opening.group(1)
            elif opening.group(1) == fenced:
                fenced = None
            continue
        if fenced is None:
            lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text (links reduced to their text, code spans to their
    content), lower case, punctuation other than '-' and '_' removed, spaces turned into '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = CODE_SPAN.sub(lambda m: m.group(2), text)
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for _, line in prose_lines(path):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[tuple[int, str]]:
    found = []
    for number, line in prose_lines(path):
        definition = LINK_DEFINITION.match(line)
        if definition:
            found.append((number, definition.group(1)))
            continue
        text = CODE_SPAN.sub("", line)
        found.extend((number, m.group(1)) for m in INLINE_LINK.finditer(text))
    return found


def broken_links(path: Path) -> list[str]:
    problems = []
    for number, target in links(path):
        if not target or SCHEME.match(target) or target.startswith("//"):
            continue
        file_part, _, anchor = target.partition("#")
        destination = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(ROOT)}:{number}: {target}"
        if not destination.exists():
            problems.append(f"{where}: no such file")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            problems.append(f"{where}: no heading with that anchor in {destination.relative_to(ROOT)}")
    return problems


def test_slugs_are_githubs():
    assert slug("Jobs (Batch API)") == "jobs-batch-api"
    assert slug("Deployments: several accounts per provider") == "deployments-several-accounts-per-provider"
    assert slug("HTTP/1.1 and HTTP/2") == "http11-and-http2"
    assert slug("Model capabilities (`core/catalog.toml`)") == "model-capabilities-corecatalogtoml"
    assert slug("`python -m bench.console`: the console") == "python--m-benchconsole-the-console"
    assert slug("Messages API and Claude Code") == "messages-api-and-claude-code"


def test_the_checker_finds_a_broken_link_and_a_broken_anchor(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "a.md").write_text(
        "# Title\n\n## Two words\n\n```\n# not a heading\n[x](gone.md)\n```\n"
        "[ok](#two-words) [ok](a.md#title) `[code](gone.md)` [web](https://x.y/z)\n"
        "[bad](#not-a-heading) [bad](gone.md) [bad](a.md#nope)\n",
        encoding="utf-8",
    )
    problems = broken_links(tmp_path / "a.md")
    assert [p.split(": ")[1] for p in problems] == ["#not-a-heading", "gone.md", "a.md#nope"], problems


def test_every_relative_link_and_anchor_resolves():
    problems = [problem for path in documents() for problem in broken_links(path)]
    assert not problems, "\n".join(problems)


def test_the_readme_is_a_front_door():
    count = len(README.read_text(encoding="utf-8").splitlines())
    assert count <= README_MAX_LINES, f"README.md has {count} lines (at most {README_MAX_LINES})"


def test_no_line_speaks_of_who_wrote_it():
    problems = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in documents()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if NARRATIVE.search(line)
    ]
    assert not problems, "\n".join(problems)
