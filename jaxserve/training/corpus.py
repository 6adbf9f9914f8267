"""Offline training corpus: the Python standard library's docstrings plus English prose found on disk.

Every Python install carries it, so the embedded model can be rebuilt anywhere without a download. Sources,
in a fixed order:
1. each importable stdlib module and submodule (sorted names), its docstring and those of the public
   classes, functions and methods it defines, then the language-reference topics of `pydoc_data`;
2. general English prose (`prose_documents`): the long descriptions and license files of the installed
   distributions (sorted by name), Python's own LICENSE.txt, and the system's common license texts
   (`/usr/share/common-licenses`) where the machine has them. Docstrings alone teach a model that text is
   one short imperative sentence ("Return the foo.") and then ends; this part teaches ordinary sentences
   that go on. The set depends on what is installed: run it in the project's pinned venv to reproduce it.

Kept out, so the model does not learn to emit them: codec and table modules (`encodings.*`, `stringprep`,
...), doctest sessions (`>>>` lines and their output), code fences and markup, paragraphs that look like
code or data (few letters, many digits or brackets), and exact duplicates (inherited or copied docstrings,
license paragraphs shared by many packages).

    python -m jaxserve.training.corpus --out build/embedded/corpus

writes `train.txt` and `heldout.txt`. A document lands in the held-out split when a hash of its text says
so (`--heldout-fraction`), so the split is stable across runs. The files hold *packed* documents separated by
`<|endoftext|>`: consecutive documents of one split are joined by blank lines until a pack reaches
`--pack-chars` characters. Most docstrings are a sentence or two; separating each by the eos taught the
previous model to end any text after its first full stop (it answered "You are a helpful assistant." with
eos at once). Packed, an eos follows a few thousand characters of text, not every short paragraph.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import inspect
import io
import json
import pkgutil
import re
import sys
import sysconfig
import warnings
from collections.abc import Iterable, Iterator
from importlib import metadata
from pathlib import Path

EOS = "<|endoftext|>"

# Modules never imported: side effects on import (browser, printing, GUI, interpreter state) or nothing but
# platform stubs and tests.
SKIP_IMPORT = {
    "antigravity", "this", "__hello__", "__phello__", "idlelib", "turtledemo", "tkinter", "turtle",
    "test", "lib2to3", "ensurepip", "venv", "__main__", "msvcrt", "winreg", "winsound", "_winapi", "nt",
    "_msi", "msilib", "sitecustomize", "usercustomize", "pydoc_data", "xxsubtype", "_testcapi",
    "_testinternalcapi", "_testbuffer", "_testimportmultiple", "_testmultiphase", "_testsinglephase",
    "_xxtestfuzz", "_ctypes_test", "_testclinic", "_testexternalinspection", "_testlimitedcapi",
    "_pyrepl", "curses",
}
# Modules whose documentation is mostly data tables or generated boilerplate.
SKIP_DOCS = {"encodings", "stringprep", "unicodedata", "html.entities", "_pydecimal", "sre_constants",
             "_sre", "token", "keyword", "_opcode_metadata", "opcode"}


def stdlib_module_names() -> list[str]:
    """Sorted stdlib top-level names minus `SKIP_IMPORT`, test helpers and CJK codec tables. Private
    pure-Python twins (`_pyio`, `_pydatetime`, ...) are kept: they carry long docstrings."""
    return sorted(n for n in sys.stdlib_module_names
                  if n not in SKIP_IMPORT and not n.startswith(("_test", "_codecs_", "_xx")))


def _quiet_import(name: str):
    """Import `name` with stdout/stderr and warnings silenced; None when it fails for any reason."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        try:
            return importlib.import_module(name)
        except BaseException:  # any failing stdlib module is simply left out
            return None


def iter_modules(names: list[str]) -> Iterator[object]:
    """Each importable module in `names` and, for packages, its submodules (sorted), skipping tests."""
    for name in names:
        module = _quiet_import(name)
        if module is None:
            continue
        yield module
        path = getattr(module, "__path__", None)
        if not path:
            continue
        found = pkgutil.walk_packages(path, prefix=f"{name}.", onerror=lambda _: None)
        subs = sorted(info.name for info in found)
        for sub in subs:
            parts = sub.split(".")
            if any(p in ("test", "tests", "__main__") or p.startswith("_") for p in parts[1:]):
                continue
            sub_module = _quiet_import(sub)
            if sub_module is not None:
                yield sub_module


def _skip_docs(module_name: str) -> bool:
    return any(module_name == s or module_name.startswith(s + ".") for s in SKIP_DOCS)


def module_docstrings(module) -> Iterator[str]:
    """The module's docstring, then those of its public classes/functions (and class members) that the
    module itself defines, in sorted name order."""
    name = module.__name__
    if _skip_docs(name):
        return
    if isinstance(module.__doc__, str):
        yield module.__doc__
    for attr in sorted(vars(module)):
        if attr.startswith("_"):
            continue
        obj = vars(module)[attr]
        if not (inspect.isclass(obj) or inspect.isfunction(obj) or inspect.isbuiltin(obj)):
            continue
        if getattr(obj, "__module__", None) != name:
            continue
        if isinstance(obj.__doc__, str):
            yield obj.__doc__
        if inspect.isclass(obj):
            for member_name in sorted(vars(obj)):
                if member_name.startswith("_"):
                    continue
                doc = getattr(vars(obj)[member_name], "__doc__", None)
                if isinstance(doc, str):
                    yield doc


def pydoc_topics() -> Iterator[str]:
    """The language-reference topics shipped for `help()` (sorted by topic name), if present."""
    module = _quiet_import("pydoc_data.topics")
    topics = getattr(module, "topics", {}) if module is not None else {}
    for key in sorted(topics):
        yield topics[key]


_CODE_CHARS = set("()[]{}=<>;#\\|@$%^~`")
_RST_MARK = re.compile(r"^\s*(\.\. |[=\-~^*+#]{4,}\s*$)")


def _looks_like_prose(paragraph: str) -> bool:
    """Letters dominate, few digits, few code/markup characters, at least a few words."""
    text = paragraph.strip()
    if len(text) < 20 or len(text.split()) < 4 or "::=" in text or text.startswith("#"):
        return False  # short, a grammar rule of the language reference, or a code comment
    n = len(text)
    letters = sum(c.isalpha() for c in text)
    digits = sum(c.isdigit() for c in text)
    code = sum(c in _CODE_CHARS for c in text)
    return letters / n >= 0.65 and digits / n <= 0.08 and code / n <= 0.04


def clean_docstring(doc: str) -> str:
    """Drop doctest sessions, directive/underline lines, indented blocks and non-prose paragraphs;
    reflow each kept paragraph onto one line. Returns "" when nothing is left."""
    lines = inspect.cleandoc(doc).splitlines()
    kept, in_doctest = [], False
    for line in lines:
        stripped = line.strip()
        if stripped.startswith(">>>"):
            in_doctest = True
        if in_doctest:
            if not stripped:
                in_doctest = False
            continue
        if _RST_MARK.match(line) or line.startswith(("    ", "\t")):
            kept.append("")  # an indented block (code, literal, table) ends the paragraph and is dropped
            continue
        kept.append(line)
    paragraphs = re.split(r"\n\s*\n", "\n".join(kept))
    out = []
    for paragraph in paragraphs:
        if paragraph.rstrip().endswith("::"):  # an RST literal-block intro; its block is gone
            paragraph = paragraph.rstrip()[:-1]
        if _looks_like_prose(paragraph):
            out.append(" ".join(paragraph.split()))
    return "\n\n".join(out)


def build_documents(module_names: list[str] | None = None, *, with_topics: bool = True,
                    with_prose: bool = False) -> list[str]:
    """Cleaned, de-duplicated documents in a deterministic order (see the module docstring): the stdlib
    docstrings (and topics), then, with `with_prose`, `prose_documents()`. The stdlib part comes first and
    does not depend on `with_prose`, so its held-out documents are the same either way."""
    names = stdlib_module_names() if module_names is None else module_names
    seen: set[str] = set()
    docs: list[str] = []

    def add(raw: str) -> None:
        text = clean_docstring(raw)
        if text and text not in seen:
            seen.add(text)
            docs.append(text)

    for module in iter_modules(names):
        for doc in module_docstrings(module):
            add(doc)
    if with_topics:
        for topic in pydoc_topics():
            add(topic)
    if with_prose:
        docs.extend(d for d in prose_documents() if d not in seen)
    return docs


_FENCE = re.compile(r"^\s*(```|~~~)")
_MD_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_MD_DECOR = re.compile(r"(\*\*|__|`)")
_HTML = re.compile(r"<[^>]+>")


def clean_prose(text: str) -> list[str]:
    """The prose paragraphs of a README or license text (markdown, reST or plain), reflowed onto one line
    each: code fences, indented blocks, headings, tables and HTML lines are dropped, markdown links keep
    their text, emphasis and backquote marks go."""
    kept, in_fence = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            in_fence = not in_fence
            kept.append("")
            continue
        stripped = line.strip()
        if in_fence or line.startswith(("    ", "\t")) or stripped.startswith(("#", "|", "<", ">")) \
                or _RST_MARK.match(line):
            kept.append("")
            continue
        line = _HTML.sub("", _MD_DECOR.sub("", _MD_LINK.sub(r"\1", line)))
        kept.append(line.lstrip("-*+ ") if stripped[:2] in ("- ", "* ", "+ ") else line)
    paragraphs = (" ".join(p.split()) for p in re.split(r"\n\s*\n", "\n".join(kept)))
    return [p for p in paragraphs if _looks_like_prose(p) and len(p.split()) >= 8]


def _description(dist: metadata.Distribution) -> str:
    """The long description of a distribution: METADATA's body, or its Description field."""
    text = dist.read_text("METADATA") or ""
    _, _, body = text.partition("\n\n")
    return body if body.strip() else (dist.metadata.get("Description") or "")


def _license_texts(dist: metadata.Distribution) -> Iterator[str]:
    names = ("license", "licence", "copying", "notice", "authors")
    for path in sorted(dist.files or (), key=str):
        if any(n in path.name.lower() for n in names) and path.suffix.lower() in ("", ".txt", ".md", ".rst"):
            with contextlib.suppress(OSError, UnicodeDecodeError):
                yield path.read_text(encoding="utf-8")


def _disk_texts() -> Iterator[str]:
    """Raw texts in a fixed order: each distribution (sorted by normalised name, first install of a name
    only) description then license files; Python's LICENSE.txt; the system's common licenses."""
    by_name: dict[str, metadata.Distribution] = {}
    for dist in metadata.distributions():
        name = (dist.metadata.get("Name") or "").lower().replace("_", "-")
        if name and name not in by_name:
            by_name[name] = dist
    for name in sorted(by_name):
        yield _description(by_name[name])
        yield from _license_texts(by_name[name])
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in (stdlib / "LICENSE.txt", *sorted(Path("/usr/share/common-licenses").glob("*"))):
        if path.is_file():
            with contextlib.suppress(OSError, UnicodeDecodeError):
                yield path.read_text(encoding="utf-8")


def prose_documents(texts: Iterable[str] | None = None) -> list[str]:
    """One document per source text (default: `_disk_texts()`): its prose paragraphs that no earlier
    text had (license paragraphs repeat across packages), joined by blank lines; empty ones dropped."""
    seen: set[str] = set()
    docs = []
    for text in _disk_texts() if texts is None else texts:
        fresh = [p for p in clean_prose(text) if p not in seen]
        seen.update(fresh)
        if fresh:
            docs.append("\n\n".join(fresh))
    return docs


def pack_documents(docs: list[str], pack_chars: int) -> list[str]:
    """Consecutive documents joined by blank lines into packs of at least `pack_chars` characters (the
    last pack may be shorter); `pack_chars` <= 0 keeps every document apart."""
    if pack_chars <= 0:
        return list(docs)
    packs, current, size = [], [], 0
    for doc in docs:
        current.append(doc)
        size += len(doc) + 2
        if size >= pack_chars:
            packs.append("\n\n".join(current))
            current, size = [], 0
    if current:
        packs.append("\n\n".join(current))
    return packs


def is_heldout(doc: str, fraction: float) -> bool:
    digest = hashlib.sha256(doc.encode()).digest()
    return int.from_bytes(digest[:4], "little") / 2**32 < fraction


def split_documents(docs: list[str], heldout_fraction: float) -> tuple[list[str], list[str]]:
    train = [d for d in docs if not is_heldout(d, heldout_fraction)]
    heldout = [d for d in docs if is_heldout(d, heldout_fraction)]
    return train, heldout


def write_split(docs: list[str], path: Path) -> None:
    path.write_text(EOS.join(docs) + EOS)


def read_documents(path: str | Path) -> list[str]:
    """Inverse of the file format: the (packed) documents of a `train.txt`/`heldout.txt`."""
    return [d for d in Path(path).read_text().split(EOS) if d]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="build/embedded/corpus", help="output directory")
    parser.add_argument("--heldout-fraction", type=float, default=0.03)
    parser.add_argument("--modules", nargs="*", default=None,
                        help="only these top-level modules (default: the whole stdlib); for quick tests")
    parser.add_argument("--no-topics", action="store_true", help="leave out the pydoc_data topics")
    parser.add_argument("--no-prose", action="store_true",
                        help="leave out the English prose of installed package descriptions and licenses")
    parser.add_argument("--pack-chars", type=int, default=3000,
                        help="join consecutive documents into packs of at least this many characters "
                             "(0: one document per eos)")
    args = parser.parse_args(argv)
    docs = build_documents(args.modules, with_topics=not args.no_topics, with_prose=not args.no_prose)
    train, heldout = split_documents(docs, args.heldout_fraction)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_split(pack_documents(train, args.pack_chars), out / "train.txt")
    write_split(pack_documents(heldout, args.pack_chars), out / "heldout.txt")
    stats = {"documents": len(docs), "train_documents": len(train), "heldout_documents": len(heldout),
             "train_chars": sum(map(len, train)), "heldout_chars": sum(map(len, heldout)),
             "pack_chars": args.pack_chars, "python": sys.version.split()[0]}
    (out / "stats.json").write_text(json.dumps(stats, indent=1))
    print(json.dumps(stats))


if __name__ == "__main__":
    main()
