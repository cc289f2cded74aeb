"""Grouped merge (min_similarity): every key group gets its chunks, however many groups; merged keys of
one level's entries stay bit-identical to the level's key (shared tie ranks in retrieval)."""

import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np

from crl_jax import bank as B
from crl_jax import config as config_lib
from crl_jax.extractor.merge import grouped_order, merge_family
from crl_jax.extractor.merge_step import max_chunks

ADD, UPD, RET, EOS = 300, 301, 302, 258
N, L, D, CHUNK = 10, 2, 8, 5


def one_entry(prompt, plen, key):
    """Fake extractor: always "ADD 99 EOS" (one merged entry per chunk)."""
    del prompt, plen, key
    out = jnp.array([[ADD, 99, EOS, 0]], jnp.int32)
    return out, jnp.zeros((1, 4), jnp.float32), jnp.array([3], jnp.int32)


KW = dict(header_tokens=jnp.array([1]), max_prompt=64, max_entries_out=5, op_ids=jnp.array([ADD, UPD, RET]),
          eos_id=EOS, chunk=CHUNK, min_similarity=0.9)
# default max_chunks (the static bound for grouped chunks); one compiled program for the tests below
_merge = jax.jit(functools.partial(merge_family, family=0, generate_fn=one_entry, key=jax.random.key(0), step=2,
                                   **KW))


def bank_of(group_sizes, n=N):
    """Family 0: group g holds group_sizes[g] entries [10 g + j] with key onehot(g), added group by group."""
    b = B.init(n, L, D)
    for g, size in enumerate(group_sizes):
        for j in range(size):
            b, _ = B.add(b, jnp.array([10 * g + j, 0]), 1, jnp.eye(D)[g], 0, 1, 7)
    return b


def left(b):
    return sorted(int(b.tokens[i][0]) for i in np.flatnonzero(np.asarray(b.valid)))


def test_every_group_is_merged():
    """3 levels of 3 entries, chunk 5: 3 chunks although ceil(10 / 5) = 2 (before: level 2 never merged)."""
    b, s = _merge(bank_of([3, 3, 3]))
    assert left(b) == [99, 99, 99]
    assert s.attempted.tolist() == [True, True, True, False, False]
    assert s.num_sources.tolist() == [3, 3, 3, 0, 0]
    # each merged entry keeps its level's key
    keys = {int(np.argmax(np.asarray(b.keys[i]))) for i in np.flatnonzero(np.asarray(b.valid))}
    assert keys == {0, 1, 2}


def test_worst_case_two_entry_groups_fill_the_bound():
    """N / 2 groups of two entries each: N / 2 chunks, every one merged."""
    b, s = _merge(bank_of([2, 2, 2, 2, 2]))
    assert left(b) == [99] * 5
    assert s.attempted.tolist() == [True] * 5 and s.num_sources.tolist() == [2] * 5


def test_lone_entries_take_no_chunk_and_stay():
    """A group of one and a group's tail of one are not rewritten (the carry is context only), as before;
    they take no chunk, so the groups after them still get theirs."""
    b, s = _merge(bank_of([1, 6, 1, 2]))
    # group 1: chunk of 5 merged, its 6th entry (15) stays; groups 0 and 2 (one entry) stay; group 3 merged
    assert left(b) == [0, 15, 20, 99, 99]
    assert s.num_sources.tolist() == [5, 2, 0, 0, 0]
    slots, starts = grouped_order(bank_of([1, 6, 1, 2]), 0, CHUNK, 5, 0.9)
    assert slots.tolist()[:10] == [1, 2, 3, 4, 5, 8, 9, -1, -1, -1] and starts.tolist() == [True, True, False,
                                                                                             False, False]


def test_grouped_layout_matches_reference_on_random_banks():
    """Random group sizes (one level each) in a bank of 24: every entry that is not alone in its chunk
    appears exactly once, in its group's chunks, oldest first; chunks never mix groups."""
    from crl_jax.extractor.merge import grouped_chunk_bound

    n, c = 24, 5
    C = grouped_chunk_bound(n, c)
    assert C == 12
    layout = jax.jit(lambda b: grouped_order(b, 0, c, C, 0.9))
    rng = np.random.default_rng(0)
    for _ in range(20):
        sizes = []
        while sum(sizes) < n:
            sizes.append(int(rng.integers(1, 8)))
        sizes[-1] -= sum(sizes) - n
        sizes = [s for s in sizes if s > 0][:8]  # <= 8 one-hot keys of width 8
        b = B.init(n, L, 8)
        for g, size in enumerate(sizes):
            for _j in range(size):
                b, _ = B.add(b, jnp.array([g, 0]), 1, jnp.eye(8)[g], 0, 1, 7)
        slots, starts = layout(b)
        # reference: slots were filled in insertion order (empty bank, no eviction)
        want, want_starts, first = [], [], 0
        for size in sizes:
            members = list(range(first, first + size))
            first += size
            chunks = [members[i:i + c] for i in range(0, size, c)]
            chunks = [ch for ch in chunks if len(ch) >= 2]
            for k, ch in enumerate(chunks):
                want += ch + [-1] * (c - len(ch))
                want_starts.append(k == 0)
        assert len(want) <= C * c, sizes
        want += [-1] * (C * c - len(want))
        want_starts += [False] * (C - len(want_starts))
        assert slots.tolist() == want, sizes
        assert starts.tolist() == want_starts, sizes


def test_max_chunks_of_the_presets():
    """Grouped merge (similarity floor on): capacity // 2 chunks; off (the LLM presets): ceil(capacity / chunk),
    or merge_max_chunks."""
    root = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "configs"
    cfg = config_lib.load(overrides={"extraction": {"merge": True}})
    assert max_chunks(cfg) == 512  # tiny default with merge on: 1,024 entries, min_similarity 0.95 (was 205)
    assert max_chunks(config_lib.load(str(root / "minihack_real.yaml"))) == 512
    assert max_chunks(config_lib.load(str(root / "qwen_paper.yaml"))) == 4000  # 20,000 entries, ungrouped
    assert max_chunks(config_lib.load(str(root / "smollm2_room.yaml"))) == 32  # merge_max_chunks
    capped = config_lib.load(overrides={"extraction": {"merge_max_chunks": 32}})
    assert max_chunks(capped) == 32


def test_merged_key_of_one_level_is_bit_identical():
    """The review's setting: 4 entries of one unit key (64 wide), 3 merged into 1; the merged entry's key is
    the level's key bit for bit, so it ties exactly with its unmerged sibling (before: 17 of 50 differed)."""
    merge = jax.jit(lambda b: B.apply_merge(b, jnp.array([0, 1, 2, -1]), jnp.ones((1, 2), jnp.int32),
                                            jnp.array([1]), jnp.array([True]), 0, 2, 9))
    for s in range(50):
        k = B.normalize(jax.random.normal(jax.random.key(s), (64,)))
        b = B.init(8, 2, 64)
        for j in range(4):
            b, _ = B.add(b, jnp.array([j, 0]), 1, k, 0, 1, 7)
        b2, slots = merge(b)
        v = np.asarray(b2.valid)
        assert v.sum() == 2
        keys = np.asarray(b2.keys)[v]  # the merged entry and its unmerged sibling (slot 3)
        assert (keys == np.asarray(b.keys[3])).all(), s
        sim = np.asarray(jnp.matmul(B.normalize(k[None]), b2.keys.T, precision=jax.lax.Precision.HIGHEST))[0]
        assert len(set(sim[v].tolist())) == 1, s


def test_merged_key_of_different_keys_is_the_normalised_mean():
    b = B.init(4, 2, 2)
    b, _ = B.add(b, jnp.array([1, 0]), 1, jnp.array([1.0, 0.0]), 0, 1, 7)
    b, _ = B.add(b, jnp.array([2, 0]), 1, jnp.array([0.0, 1.0]), 0, 1, 7)
    b, _ = B.add(b, jnp.array([3, 0]), 1, jnp.array([0.0, 1.0]), 0, 1, 7)
    b2, slots = B.apply_merge(b, jnp.array([1, 2]), jnp.ones((1, 2), jnp.int32), jnp.array([1]),
                              jnp.array([True]), 0, 2, 9)
    np.testing.assert_array_equal(np.asarray(b2.keys[slots[0]]), [0.0, 1.0])  # the two equal keys
    b3, slots = B.apply_merge(b, jnp.array([0, 1, -1]), jnp.ones((1, 2), jnp.int32), jnp.array([1]),
                              jnp.array([True]), 0, 2, 9)
    np.testing.assert_allclose(np.asarray(b3.keys[slots[0]]), [2 ** -0.5, 2 ** -0.5], rtol=1e-6)
