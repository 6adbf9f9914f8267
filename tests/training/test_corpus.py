"""The corpus builder's prose cleaning and document packing (host-side text processing)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from jaxserve.training import corpus

README = """# fastthing

[![build](https://ci.example/badge.svg)](https://ci.example)

fastthing is a **small** library that parses [configuration files](https://example.org/docs) quickly and
reports every error with the line it came from.

```python
import fastthing
fastthing.load("a.toml")
```

    indented = "code block"

| column | other |
|---|---|
| a | b |

- It never allocates more memory than the file it reads needs.
"""


def test_clean_prose_keeps_sentences_and_drops_code_tables_headings_and_markup():
    assert corpus.clean_prose(README) == [
        "fastthing is a small library that parses configuration files quickly and reports every error with "
        "the line it came from.",
        "It never allocates more memory than the file it reads needs.",
    ]


def test_prose_documents_drop_paragraphs_an_earlier_text_had():
    licence = "Permission is hereby granted, free of charge, to any person obtaining a copy of this software."
    docs = corpus.prose_documents([licence, "A fresh sentence that no other package has written before.\n\n"
                                   + licence, licence])
    assert docs == [licence, "A fresh sentence that no other package has written before."]


def test_prose_documents_from_disk_are_english_prose():
    docs = corpus.prose_documents()
    assert sum(map(len, docs)) > 100_000  # licenses and package descriptions of the pinned venv
    text = "\n\n".join(docs)
    assert "```" not in text and ">>>" not in text


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=40), max_size=30), st.integers(-5, 120))
def test_pack_documents_keeps_order_and_makes_minimal_packs(docs, pack_chars):
    packs = corpus.pack_documents(docs, pack_chars)
    if pack_chars <= 0:
        assert packs == docs
        return
    # brute force: greedily regroup the documents and compare
    groups, current = [], []
    for doc in docs:
        current.append(doc)
        if sum(len(d) + 2 for d in current) >= pack_chars:
            groups.append(current)
            current = []
    if current:
        groups.append(current)
    assert packs == ["\n\n".join(g) for g in groups]
    for group in groups[:-1]:  # every pack but the last is just long enough
        assert sum(len(d) + 2 for d in group) >= pack_chars > sum(len(d) + 2 for d in group[:-1])
