#!/usr/bin/env python3
"""Checks README.md and docs/*.md: the README stays a five-minute read (at most 200 lines), no page
links outside the repository (no http(s) address but loopback ones) or to a file that is not there,
and docs/index.md links every page of docs/. Usage: check_docs.py [REPO_ROOT] (default: this
checkout). .ci/run runs it after the quickstart; python/tests/test_docs.py in the test suite."""
import pathlib
import re
import sys

README_MAX_LINES = 200
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
HTML_LINK = re.compile(r"""(?:href|src)\s*=\s*["']([^"']+)["']""", re.I)
ADDRESS = re.compile(r"\b(?:https?|ftp)://[^\s)>\]\"'`]+|\bwww\.[a-z0-9-]+\.[a-z][^\s)>\]\"'`]*", re.I)
LOOPBACK = re.compile(r"^(?:https?|ftp)://(?:localhost|127\.0\.0\.1|\[::1\])(?:[:/]|$)", re.I)


def problems_of(page: pathlib.Path, root: pathlib.Path) -> list[str]:
    text = page.read_text(encoding="utf-8")
    name = page.relative_to(root).as_posix()
    found = []
    for address in ADDRESS.findall(text):  # code blocks included: a URL there is a link too
        if not LOOPBACK.match(address):
            found.append(f"{name}: links outside the repository: {address}")
    prose = CODE_SPAN.sub("", FENCE.sub("", text))
    targets = INLINE_LINK.findall(prose) + REF_LINK.findall(prose) + HTML_LINK.findall(prose)
    for target in targets:
        path = target.split("#", 1)[0]
        if not path or ADDRESS.match(target) or target.startswith("mailto:"):
            if target.startswith("mailto:"):
                found.append(f"{name}: links outside the repository: {target}")
            continue
        resolved = (page.parent / path).resolve()
        if not resolved.is_relative_to(root.resolve()):
            found.append(f"{name}: links outside the repository: {target}")
        elif not resolved.exists():
            found.append(f"{name}: links to a missing file: {target}")
    return found


def check(root: pathlib.Path) -> list[str]:
    readme = root / "README.md"
    pages = [readme] + sorted((root / "docs").glob("*.md"))
    found = []
    lines = readme.read_text(encoding="utf-8").count("\n")
    if lines > README_MAX_LINES:
        found.append(f"README.md has {lines} lines, more than {README_MAX_LINES}: move the detail into docs/")
    for page in pages:
        found += problems_of(page, root)
    index = root / "docs" / "index.md"
    if not index.exists():
        found.append("docs/index.md is missing")
    else:
        linked = {(index.parent / t.split("#", 1)[0]).resolve()
                  for t in INLINE_LINK.findall(CODE_SPAN.sub("", FENCE.sub("", index.read_text())))}
        for page in pages[1:]:
            if page != index and page.resolve() not in linked:
                found.append(f"docs/index.md does not link {page.relative_to(root).as_posix()}")
    return found


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent.parent)
    found = check(root)
    for problem in found:
        print(f"check_docs: {problem}", file=sys.stderr)
    if found:
        return 1
    print(f"check_docs: ok (README.md {(root / 'README.md').read_text().count(chr(10))} lines, "
          f"{len(list((root / 'docs').glob('*.md')))} docs pages, every link inside the repository)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
