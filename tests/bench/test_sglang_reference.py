"""SGLang 0.5.3.post1's own prefix caches (its sources, which `scripts/setup.sh` installs; run by
`jaxserve.bench.sglang_reference`) replay the cache benchmark's requests beside ours: from a pool that never
fills to one of about a dozen prompts, every request reuses exactly as many cached slots from our tree as
from SGLang's. So our trees keep, split and evict the same prefixes SGLang's do on this workload (full and
sliding-window trees, token and EAGLE bigram keys, page size 1: SGLang's paged allocator needs a GPU)."""

from __future__ import annotations

import numpy as np
import pytest

from jaxserve.bench import cache as bench
from jaxserve.bench import sglang_reference


@pytest.fixture(scope="module")
def ref():
    return sglang_reference.load(sglang_reference.default_sources())


@pytest.fixture(scope="module")
def requests():
    return bench.make_workload(300, seed=1)


@pytest.mark.parametrize("slots", [1 << 16, 1 << 14], ids=["some-eviction", "heavy-eviction"])
@pytest.mark.parametrize("eagle", [False, True], ids=["tokens", "bigrams"])
@pytest.mark.parametrize("kind", ["full", "swa"])
def test_every_request_reuses_what_sglangs_own_tree_reuses(ref, requests, monkeypatch, kind, eagle, slots):
    monkeypatch.setattr(bench, "POOL_SLOTS", slots)
    tree = bench.make_tree(kind, 1, eagle)
    ours = [bench.run_ours_request(tree, prompt, np.append(prompt, 0)) for prompt in requests]
    theirs: list[int] = []
    sglang_reference.run(ref, kind, eagle, requests, num_slots=slots, sliding_window=bench.SLIDING_WINDOW,
                         reused=theirs)
    assert ours == theirs
    assert sum(ours) > 0 and ours.count(0) > 50 if slots == 1 << 14 else sum(ours) > 0  # eviction bites


def test_load_refuses_a_directory_without_the_pinned_sources(tmp_path):
    with pytest.raises(FileNotFoundError, match="no SGLang sources"):
        sglang_reference.load(tmp_path)
    mem_cache = tmp_path / "sglang" / "srt" / "mem_cache"
    mem_cache.mkdir(parents=True)
    (mem_cache / "radix_cache.py").write_text("")
    (tmp_path / "sglang" / "version.py").write_text('__version__ = "0.5.4"\n')
    with pytest.raises(ValueError, match=r"is not 0\.5\.3\.post1"):
        sglang_reference.load(tmp_path)
