"""The repository explains its own rules: no source, test, config or doc file points a reader at a document
that is not in the repository, and every `cache/README.md` section that code names exists."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXT_SUFFIXES = {".py", ".md", ".toml", ".txt", ".ipynb", ".yaml", ".yml", ".sh", ".cfg"}
SKIP_DIRS = {".git", ".venv", "build", "dist", ".jax_cache", ".hypothesis", ".pytest_cache", ".ruff_cache"}
# Names of documents that live outside the repository, and the section sign they were cited with.
OUTSIDE = re.compile(
    r"§|reference doc|reference/|shared/|sglang-mem-cache|jax-on-cpu|jax-scale-out|kernels\.md|eagle3-gptoss"
    r"|anchors\.md|ARCHITECTURE\.md|STYLE\.md",
    re.IGNORECASE,
)
# A citation may wrap across lines: `cache/README.md`, "SWA\n eviction".
README_SECTION = re.compile(r'cache/README\.md`?,?\s+"([^"]+)"(?:\s+to\s+"([^"]+)")?')


def text_files() -> list[Path]:
    """The repository's text files: what git tracks or would track (ignored build outputs, venvs and caches
    left out), or without git every file outside SKIP_DIRS."""
    try:
        listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                                capture_output=True, text=True, check=True).stdout.splitlines()
        candidates = [ROOT / name for name in listed]
    except (OSError, subprocess.CalledProcessError):
        candidates = [p for p in ROOT.rglob("*") if not set(p.relative_to(ROOT).parts) & SKIP_DIRS]
    here = Path(__file__).resolve()
    return [p for p in candidates if p.suffix in TEXT_SUFFIXES and p.is_file() and p.resolve() != here]


def test_the_scan_sees_the_tree() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in text_files()}
    assert {"cache/README.md", "cache/radix_cache.py", "pyproject.toml", "README.md"} <= names


def test_no_file_cites_a_document_outside_the_repository() -> None:
    hits = []
    for path in text_files():
        for num, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if OUTSIDE.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{num}: {line.strip()[:100]}")
    assert not hits, "explain the rule here instead of citing an outside document:\n" + "\n".join(hits)


def test_every_cited_cache_readme_section_exists() -> None:
    headings = {
        line[3:].strip()
        for line in (ROOT / "cache" / "README.md").read_text(encoding="utf-8").splitlines()
        if line.startswith("## ")
    }
    cited = set()
    for path in text_files():
        for match in README_SECTION.finditer(path.read_text(encoding="utf-8", errors="replace")):
            cited.update(re.sub(r"\s+", " ", name) for name in match.groups() if name)
    assert cited, "no code names a cache/README.md section (the pattern no longer matches how they are cited)"
    assert cited <= headings, f"sections named in code but missing from cache/README.md: {cited - headings}"
