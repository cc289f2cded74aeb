"""Merge with a scripted generate_fn: the exact resulting bank, the carried context, provenance, jit."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from crl_jax import bank as bank_lib
from crl_jax.extractor.merge import family_order, merge_bank, merge_family

ADD, UPD, RET, EOS = 300, 301, 302, 258
HEADER, CTX, ENTRIES, SUFFIX, SEP = 200, 203, 201, 202, 204
R = 8  # response length


def scripted_generate(prompt, plen, key):
    """Deterministic fake extractor. It reads chunk tokens c0 c1 c2 ... (between ENTRIES and SUFFIX, SEP
    removed) and answers ADD c0 c1 ADD c2 EOS (ADD c0 EOS for one entry); a chunk starting with 16 gets
    RETURN. Log-prob of token t is -t / 1000 so the test can check they are kept."""
    del key
    p = prompt[0]
    P = p.shape[0]
    i = jnp.arange(P)
    start = jnp.argmax(p == ENTRIES) + 1
    inside = (i >= start) & (i < plen[0] - 1) & (p != SEP)
    content = p[jnp.nonzero(inside, size=P, fill_value=0)[0]]  # chunk tokens first
    n = jnp.sum(inside)
    two = jnp.array([ADD, content[0], content[1], ADD, content[2], EOS, 0, 0])
    one = jnp.array([ADD, content[0], EOS, 0, 0, 0, 0, 0])
    ret = jnp.array([RET, EOS, 0, 0, 0, 0, 0, 0])
    out = jnp.where(content[0] == 16, ret, jnp.where(n >= 3, two, one)).astype(jnp.int32)
    length = jnp.argmax(out == EOS) + 1
    return out[None], (-out / 1000.0).astype(jnp.float32)[None], length[None].astype(jnp.int32)


@functools.lru_cache(maxsize=1)
def make_bank():
    """Family 0 entries e0..e6 = [10+i] with keys onehot(i % 4); family 1 entries x0..x2 = [50+j], interleaved.

    Insert order / slots: e0 0, e1 1, x0 2, e2 3, e3 4, x1 5, e4 6, e5 7, x2 8, e6 9."""
    b = bank_lib.init(16, 4, 4)
    e = x = 0
    for fam in [0, 0, 1, 0, 0, 1, 0, 0, 1, 0]:
        if fam == 0:
            tok, key = [10 + e, 0, 0, 0], jnp.eye(4)[e % 4]
            e += 1
        else:
            tok, key = [50 + x, 0, 0, 0], jnp.ones(4)
            x += 1
        b, _ = bank_lib.add(b, jnp.array(tok), 1, key, fam, 1, 7)
    return b


KW = dict(header_tokens=jnp.array([HEADER]), context_prefix=jnp.array([CTX]), entries_prefix=jnp.array([ENTRIES]),
          suffix=jnp.array([SUFFIX]), max_prompt=32, max_entries_out=2, op_ids=jnp.array([ADD, UPD, RET]),
          eos_id=EOS, chunk=3)


# one compiled program shared by the tests below (family, step and source_start are traced)
_merge = jax.jit(functools.partial(merge_family, generate_fn=scripted_generate, **KW))


def run(bank, family=0, source_start=100):
    return _merge(bank, family, key=jax.random.key(0), step=9, source_start=source_start)


def rows(b):
    return {int(s): (list(map(int, b.tokens[s][: b.lengths[s]])), int(b.task[s]), int(b.source[s]))
            for s in np.nonzero(np.asarray(b.valid))[0]}


def test_family_order():
    slots, n = family_order(make_bank(), 0, 9)
    assert slots.tolist() == [0, 1, 3, 4, 6, 7, 9, -1, -1] and int(n) == 7


def test_merge_exact_bank():
    b0 = make_bank()
    b, s = run(b0)
    # chunk 0 = e0 e1 e2 (slots 0 1 3) -> [10 11], [12] written into the freed slots 0, 1
    # chunk 1 = e3 e4 e5 (slots 4 6 7) -> [13 14], [15] into the lowest free slots 3, 4
    # chunk 2 = e6 answers RETURN -> not applied, e6 stays; family 1 untouched
    assert rows(b) == {0: ([10, 11], 0, 100), 1: ([12], 0, 100), 3: ([13, 14], 0, 101), 4: ([15], 0, 101),
                       9: ([16], 0, 7), 2: ([50], 1, 7), 5: ([51], 1, 7), 8: ([52], 1, 7)}
    eye = np.eye(4)
    k01 = (eye[0] + eye[1] + eye[2]) / np.sqrt(3)
    k2 = (eye[3] + eye[0] + eye[1]) / np.sqrt(3)
    for slot, key in ((0, k01), (1, k01), (3, k2), (4, k2), (9, eye[2])):
        np.testing.assert_allclose(np.asarray(b.keys[slot]), key, atol=1e-6)
    assert [int(b.updated_step[i]) for i in (0, 1, 3, 4, 9)] == [9, 9, 9, 9, 1]
    # merged entries are the newest in FIFO order (chunk order kept)
    assert np.argsort(np.asarray(b.insert_order)[[0, 1, 3, 4]]).tolist() == [0, 1, 2, 3]
    assert int(b.insert_order[0]) > int(b.insert_order[9])
    # samples: 6 chunk slots, 3 attempted, 2 applied, with their source ids
    assert s.attempted.tolist() == [True, True, True, False, False, False]
    assert s.mask.tolist() == [True, True, False, False, False, False]
    assert s.source.tolist() == [100, 101, -1, -1, -1, -1]
    assert s.num_sources.tolist() == [3, 3, 1, 0, 0, 0] and s.num_merged.tolist() == [2, 2, 0, 0, 0, 0]
    # prompts: chunk 0 has no context; chunk 1 carries chunk 0's merged output; chunk 2 carries chunk 1's
    p = [s.prompt[c][: s.prompt_len[c]].tolist() for c in range(3)]
    assert p[0] == [HEADER, ENTRIES, 10, 11, 12, SUFFIX]
    assert p[1] == [HEADER, CTX, 10, 11, 12, ENTRIES, 13, 14, 15, SUFFIX]
    assert p[2] == [HEADER, CTX, 13, 14, 15, ENTRIES, 16, SUFFIX]
    assert s.response[0][: s.response_len[0]].tolist() == [ADD, 10, 11, ADD, 12, EOS]
    np.testing.assert_allclose(np.asarray(s.logp[0][:2]), [-0.3, -0.01], atol=1e-6)
    assert int(s.response_len[3]) == 0 and int(s.prompt_len[3]) > 0


def test_merge_separator_and_unapplied_carry():
    """A chunk that is not applied carries its own entries into the next chunk's prompt."""
    b = make_bank()
    # rewrite e3 (slot 4) to start with 16 so that chunk 1 answers RETURN
    b = bank_lib.update(b, 4, jnp.array([16, 0, 0, 0]), 1, 2, 8)
    kw = dict(KW, entry_sep=jnp.array([SEP]), max_prompt=40, max_chunks=3)
    b2, s = jax.jit(lambda bb: merge_family(bb, 0, scripted_generate, jax.random.key(1), 9, source_start=5,
                                            **kw))(b)
    assert s.mask.tolist() == [True, False, False] and s.source.tolist() == [5, -1, -1]
    p2 = s.prompt[2][: s.prompt_len[2]].tolist()
    assert p2 == [HEADER, CTX, SEP, 16, SEP, 14, ENTRIES, SEP, 16, SUFFIX]  # carry = e3 e4 (first 2 of chunk 1)
    # chunks 1 (e3 e4 e5) and 2 (e6) answered RETURN: their entries are untouched
    assert rows(b2)[4] == ([16], 0, 8) and rows(b2)[6] == ([14], 0, 7) and rows(b2)[9] == ([16], 0, 7)
    assert rows(b2)[0] == ([10, 11], 0, 5) and rows(b2)[1] == ([12], 0, 5)


def test_merge_no_source_ids_and_other_family():
    b, s = run(make_bank(), source_start=-1)
    assert s.source.tolist() == [-1] * 6 and s.mask.tolist()[:2] == [True, True]
    assert int(b.source[0]) == -1
    b1, s1 = run(make_bank(), family=1, source_start=-1)
    assert rows(b1)[2] == ([50, 51], 1, -1) and rows(b1)[5] == ([52], 1, -1)
    assert set(rows(b1)) == {0, 1, 2, 3, 4, 5, 6, 7, 9}


def test_merge_bank_scans_families_and_retrace_guard():
    @jax.jit
    @chex.assert_max_traces(n=1)
    def go(bb, key):
        return merge_bank(bb, 2, scripted_generate, key, 9, source_start=100, **KW)

    b, s = go(make_bank(), jax.random.key(0))
    go(make_bank(), jax.random.key(1))
    chex.assert_shape(s.mask, (2, 6))
    assert s.source.tolist() == [[100, 101, -1, -1, -1, -1], [102, -1, -1, -1, -1, -1]]
    assert rows(b)[0] == ([10, 11], 0, 100) and rows(b)[2] == ([50, 51], 1, 102)


def test_merge_prompt_budget_checked():
    with pytest.raises(ValueError, match="max_prompt"):
        merge_family(make_bank(), 0, scripted_generate, jax.random.key(0), 9, **dict(KW, max_prompt=20))
