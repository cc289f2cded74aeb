"""Token-space packing and prompts, constrained operation parsing, JSON operation parsing (literal cases)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from crl_jax.extractor.ops import (ADD, RETURN, UPDATE, Operation, build_distill_prompt,
                               parse_constrained, parse_constrained_ops, parse_operations,
                               parse_operations_with_stats)
from crl_jax.text.packing import pack_segments, truncate_left, truncate_right
from crl_jax.text.tokenizers import ByteTokenizer

A = jnp.asarray
OPS = (300, 301, 302)  # <ADD>, <UPDATE>, <RETURN>
EOS = 258


def L(x):
    return np.asarray(x).tolist()


# --- packing -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("jit", [False, True])
def test_pack_segments_literal(jit):
    def f(a, b, c):
        return pack_segments([(a, 2), (b, 0), c, (b, 3)])

    f = jax.jit(f) if jit else f
    out, n = f(A([1, 2, 9]), A([5, 6, 7, 8]), A([3]))
    assert L(out) == [1, 2, 3, 5, 6, 7] + [0] * 6 and int(n) == 6
    out, n = pack_segments([(A([1, 2, 3]), 3), (A([4, 5]), 2)], size=4, pad_id=-1)
    assert L(out) == [1, 2, 3, 4] and int(n) == 4  # overflow cut at the end
    out, n = pack_segments([(A([1, 2]), 1)], size=4, pad_id=-1)
    assert L(out) == [1, -1, -1, -1] and int(n) == 1


@pytest.mark.parametrize("jit", [False, True])
def test_truncate(jit):
    tl = jax.jit(truncate_left) if jit else truncate_left
    assert [L(x) for x in tl(A([1, 2, 3, 4, 0]), 4, 2)] == [[3, 4, 0, 0, 0], 2]
    assert [L(x) for x in tl(A([1, 2, 3, 4, 0]), 4, 9)] == [[1, 2, 3, 4, 0], 4]
    assert [L(x) for x in tl(A([1, 2, 3]), 3, 0)] == [[0, 0, 0], 0]
    assert [L(x) for x in truncate_right(A([1, 2, 3, 4]), 3, 2)] == [[1, 2, 0, 0], 2]


def test_distill_prompt_keeps_goal_and_outcome():
    header, goal, outcome = A([100, 101]), (A([7, 8, 0]), 2), (A([50, 51, 52]), 2)
    traj = A(list(range(10, 30)))  # 20 moves
    ret = A([60, 61, 0, 0])
    kw = dict(trajectory_prefix=A([90]), retrieved_prefix=A([91]), suffix=A([99]))

    @jax.jit
    @chex.assert_max_traces(n=1)
    def build(tl, rl):
        return build_distill_prompt(header, goal, traj, tl, outcome, ret, rl, 16, **kw)

    p, n = build(20, 2)
    # fixed: 2 + 2 + 1 + 2 + 1 + 2 + 1 = 11 -> the last 5 moves survive
    assert L(p) == [100, 101, 7, 8, 90, 25, 26, 27, 28, 29, 50, 51, 91, 60, 61, 99] and int(n) == 16
    p, n = build(3, 0)  # short trajectory, no retrieved entry: prefix 91 dropped too
    assert L(p)[:int(n)] == [100, 101, 7, 8, 90, 10, 11, 12, 50, 51, 99] and int(n) == 11
    assert L(p)[int(n):] == [0] * 5
    with pytest.raises(ValueError, match="budget"):
        build_distill_prompt(header, goal, traj, 20, outcome, ret, 2, 12, **kw)


def test_distill_prompt_with_tokenizer_text():
    tok = ByteTokenizer()
    enc = lambda s: A(tok.encode(s))  # noqa: E731
    traj = enc("abcdefghijklmnopqrstuvwxyz")
    p, n = build_distill_prompt(enc("H:"), enc("goal"), traj, traj.shape[0], enc("|win"), A([0] * 4), 0, 20)
    assert tok.decode(L(p)[:int(n)]) == "H:goalqrstuvwxyz|win"  # 20 - 10 fixed = 10 moves


# --- constrained operations ---------------------------------------------------------------------------


def _pc(resp, n, entry_len=4):
    op, e, el, v = jax.jit(parse_constrained, static_argnums=(3, 4))(A(resp), n, A(OPS), EOS, entry_len)
    return int(op), L(e), int(el), bool(v)


def test_parse_constrained_literal():
    assert _pc([300, 5, 6, EOS, 9, 9], 6) == (ADD, [5, 6, 0, 0], 2, True)
    assert _pc([301, 5, 6, 7, 8, 9], 6) == (UPDATE, [5, 6, 7, 8], 4, True)  # clipped to entry_len
    assert _pc([300, 5, 6, 7, 8, 9], 2) == (ADD, [5, 0, 0, 0], 1, True)  # response length bounds it
    assert _pc([302, 5, 6, EOS, 0, 0], 6) == (RETURN, [0, 0, 0, 0], 0, True)
    assert _pc([300, EOS, 5, 6, 0, 0], 6) == (RETURN, [0, 0, 0, 0], 0, False)  # empty add
    assert _pc([301, 5, 6, 0, 0, 0], 1) == (RETURN, [0, 0, 0, 0], 0, False)  # empty update (length 1)
    assert _pc([5, 300, 6, 0, 0, 0], 6) == (RETURN, [0, 0, 0, 0], 0, False)  # no op token first
    assert _pc([300, 5, 6, 0, 0, 0], 0) == (RETURN, [0, 0, 0, 0], 0, False)  # empty response
    assert _pc([EOS, 5, 6, 0, 0, 0], 6) == (RETURN, [0, 0, 0, 0], 0, False)
    assert _pc([300, 5, 301, 6, 0, 0], 6) == (ADD, [5, 0, 0, 0], 1, True)  # ends at the next op token
    # non-jit path and a tuple of op ids give the same answer
    op, e, el, v = parse_constrained(A([300, 5, 6, EOS]), 4, OPS, EOS, 4)
    assert (int(op), L(e), int(el), bool(v)) == (ADD, [5, 6, 0, 0], 2, True)


def test_parse_constrained_vmap():
    resp = A([[300, 5, EOS, 0], [302, 0, 0, 0], [7, 7, 7, 7]])
    op, e, el, v = jax.vmap(lambda r, n: parse_constrained(r, n, A(OPS), EOS, 3))(resp, A([4, 4, 4]))
    assert L(op) == [ADD, RETURN, RETURN] and L(el) == [1, 0, 0] and L(v) == [True, True, False]


def test_parse_constrained_ops_literal():
    f = jax.jit(lambda r, n: parse_constrained_ops(r, n, A(OPS), EOS, 3, 2))
    r = f(A([9, 300, 5, 6, 300, 7, 301, 300, 8, EOS, 300, 4]), 12)
    assert L(r.op) == [ADD, ADD] and L(r.entry) == [[5, 6, 0], [7, 0, 0]] and L(r.entry_len) == [2, 1]
    assert L(r.mask) == [True, True] and int(r.num_ops) == 4 and bool(r.stray)
    r = f(A([300, EOS, 300, 5, 0, 0]), 6)  # empty first entry is masked, the one after EOS never read
    assert L(r.mask) == [False, False] and int(r.num_ops) == 1 and not bool(r.stray)
    r = f(A([302, 301, 5, 0]), 4)
    assert L(r.op) == [RETURN, UPDATE] and L(r.mask) == [False, True] and L(r.entry[1]) == [5, 0, 0]


# --- JSON operations -----------------------------------------------------------------------------------

ENTRY = "<title>Doors</title><content>Open the red door first.</content>"


def test_parse_operations_valid():
    t = f'think... <answer>[{{"op": "add", "text": "{ENTRY}"}}, {{"op": "RETURN"}}]</answer>'
    ops = parse_operations(t)
    assert ops == [Operation("add", ENTRY), Operation("return")]
    assert ops[0].title == "Doors" and ops[0].content == "Open the red door first."
    ops, st = parse_operations_with_stats(t)
    assert st.valid and st.n_add == 1 and st.n_return == 1 and st.dropped == 0 and not st.repaired


@pytest.mark.parametrize("text,expect", [
    # last answer block wins; fences, trailing commas, single object, aliases, title/content fields
    ('<answer>[]</answer> <ANSWER> [{"op":" Update ","text":"x"}] </Answer>', [Operation("update", "x")]),
    ('<answer>\n```json\n[{"op":"add","text":"a"},]\n```\n</answer>', [Operation("add", "a")]),
    ('<answer>{"operation": "add", "title": "T", "content": "C"}</answer>',
     [Operation("add", "<title>T</title><content>C</content>")]),
    ('<answer>Here you go: [{"op":"add","text":"a, ]"},] trailing prose</answer>', [Operation("add", "a, ]")]),
    ('<answer>[{"op":"add","text":"truncated but closed"}]', [Operation("add", "truncated but closed")]),
    ('<answer>[]</answer>', []),
])
def test_parse_operations_lenient(text, expect):
    assert parse_operations(text) == expect
    assert parse_operations_with_stats(text)[1].valid


@pytest.mark.parametrize("text,reason", [
    ("no tags at all", "no <answer>"),
    ('<answer>[{"op": "delete", "text": "x"}]</answer>', "unknown op"),
    ('<answer>[{"op": "add"}]</answer>', "text"),
    ('<answer>[{"op": "add", "text": "   "}]</answer>', "text"),
    ('<answer>[{"op": "add", "text": 5}]</answer>', "text"),
    ('<answer>[{"op": ["add"], "text": "x"}]</answer>', "string 'op'"),
    ('<answer>[{"op": "add", "text": "x"}, 3]</answer>', "int"),
    ('<answer>"add"</answer>', "JSON str"),
    ('<answer>add please</answer>', "no JSON"),
    ("<answer>[{'op': 'add', 'text': 'x'}]</answer>", "bad JSON"),
    ('<answer>[{"op": "add", "text": "x"}</answer>', "bad JSON"),
    ("<answer>" + "[" * 100000 + "</answer>", "JSON"),
    (None, "not text"),
], ids=lambda x: str(x)[:30])
def test_parse_operations_invalid(text, reason):
    ops, st = parse_operations_with_stats(text)
    assert ops == [] and not st.valid and reason in st.error


def test_parse_operations_caps_three():
    items = ",".join(f'{{"op":"add","text":"e{i}"}}' for i in range(5))
    ops, st = parse_operations_with_stats(f"<answer>[{items}, 7]</answer>")  # the junk is beyond the cap
    assert [o.text for o in ops] == ["e0", "e1", "e2"] and st.dropped == 3 and st.valid and st.num_ops == 3


def test_operations_callback_in_jit():
    from crl_jax.extractor.ops_json import parse_operations_callback

    tok = ByteTokenizer()
    texts = ['<answer>[{"op":"add","text":"abcdef"},{"op":"return"}]</answer>', "garbage",
             '<answer>[{"op":"update","text":"xy"}]</answer>']
    rows = [tok.encode(t) for t in texts]
    T = max(map(len, rows))
    toks = np.array([r + [0] * (T - len(r)) for r in rows], np.int32)
    lens = np.array([len(r) for r in rows], np.int32)
    f = jax.jit(lambda t, n: parse_operations_callback(t, n, tok.decode, tok.encode, entry_len=4))
    out = f(toks, lens)
    assert L(out["valid"]) == [True, False, True]
    assert L(out["op"]) == [[ADD, RETURN, RETURN], [RETURN] * 3, [UPDATE, RETURN, RETURN]]
    assert L(out["mask"]) == [[True, False, False], [False] * 3, [True, False, False]]
    assert L(out["entry"][0, 0]) == tok.encode("abcd") and L(out["entry_len"][:, 0]) == [4, 0, 2]
