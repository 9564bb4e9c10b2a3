# scripts/check_docs.py on this checkout (README.md at most 200 lines, every link of README.md and
# docs/*.md inside the repository and to a file that exists, docs/index.md linking every page),
# and on small trees that break each rule, so the check itself can fail.
import importlib.util
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "check_docs.py"
spec = importlib.util.spec_from_file_location("check_docs", SCRIPT)
check_docs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_docs)


def test_this_checkout_passes():
    r = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "check_docs: ok" in r.stdout


def make_tree(tmp_path, readme="# kiln\n\n[docs](docs/index.md)\n", pages=None):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(readme)
    pages = pages if pages is not None else {"index.md": "# Docs\n\n[a](a.md)\n", "a.md": "# A\n"}
    for name, text in pages.items():
        (tmp_path / "docs" / name).write_text(text)
    return tmp_path


def test_a_clean_tree_passes(tmp_path):
    assert check_docs.check(make_tree(tmp_path)) == []


def test_a_long_readme_fails(tmp_path):
    root = make_tree(tmp_path, readme="[docs](docs/index.md)\n" + "line\n" * 200)
    assert check_docs.check(root) == ["README.md has 201 lines, more than 200: move the detail into docs/"]


def test_links_outside_the_repository_fail(tmp_path):
    root = make_tree(tmp_path, pages={
        "index.md": "[a](a.md)\n",
        "a.md": ("[site](https://example.com/x) <http://example.org> see www.example.net\n"
                 "[up](../../etc/passwd) [loopback](http://localhost:8000/) `[](ok)`\n"
                 "```\ncurl https://example.com/in/a/block\n```\n"),
    })
    found = check_docs.check(root)
    assert "docs/a.md: links outside the repository: https://example.com/x" in found
    assert "docs/a.md: links outside the repository: http://example.org" in found
    assert "docs/a.md: links outside the repository: www.example.net" in found
    assert "docs/a.md: links outside the repository: ../../etc/passwd" in found
    assert "docs/a.md: links outside the repository: https://example.com/in/a/block" in found
    assert len(found) == 5, found  # not the loopback address, nor the code span


def test_missing_files_and_unindexed_pages_fail(tmp_path):
    root = make_tree(tmp_path, readme="[gone](docs/gone.md#part) [here](docs/a.md#part)\n", pages={
        "index.md": "[a](a.md)\n", "a.md": "[b](b.md)\n", "b.md": "# B\n"})
    assert check_docs.check(root) == [
        "README.md: links to a missing file: docs/gone.md#part",
        "docs/index.md does not link docs/b.md",
    ]
