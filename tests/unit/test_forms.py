"""The entry forms (`extraction.forms`): parsing a form on literal responses, the FACT tip and the end cell in the
prompts, the "go to the named cell" targets, the prior's data never pairing a level with a fact, the oracle and
moves archives on literal episodes, and the default vocabulary and prior id left as they were."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from crl_jax import bank as bank_lib
from crl_jax.actor.rollout import Episodes, build_prompt
from crl_jax.config import ConfigError, load
from crl_jax.config_rules import paper_overrides
from crl_jax.envs.base import DIR_NAMES, G_AGENT, G_BLANK, G_FLOOR, G_WALL
from crl_jax.envs.compact import MARKERS, compact_vocabulary, is_fact
from crl_jax.extractor.archive import archive
from crl_jax.extractor.distill import distill_prompts
from crl_jax.extractor.forms import FACT, MOVES, parse_form
from crl_jax.learner import pretrain, prior_forms
from crl_jax.learner.pretrain import _Moves
from crl_jax.loop import diagnostics
from crl_jax.loop.runtime import build

MICRO = ["rollout.groups=2", "rollout.group_size=4", "env.max_turns=4", "env.num_train_tasks=4",
         "env.num_eval_tasks=4", "extraction.batch=4", "extraction.buffer_capacity=16", "bank.capacity=16",
         "eval.tasks=2", "actor.hidden_size=32", "actor.num_layers=1", "actor.intermediate_size=64",
         "extractor.hidden_size=32", "extractor.num_layers=1", "extractor.intermediate_size=64",
         "extraction.max_new_tokens=6", "bank.entry_len=5", "extraction.prompt_len=26", "rollout.tip_window=2",
         "extraction.forms=true"]
MICRO = list(paper_overrides()) + MICRO  # the families config's write rules (its distillation layout); MICRO's win

# Literal token ids of a parse: ops 10 11 12, forms 20 (MOVES) 21 (FACT), actions 1..4, rows 30..32, cols 40..42
OPS, FORMS, ACTS, ROWS, COLS, EOS = (10, 11, 12), (20, 21), (1, 2, 3, 4), (30, 31, 32), (40, 41, 42), 99


@pytest.fixture(scope="module")
def rt():
    return build(load(None, MICRO))


def _decode(rt, toks, n):
    return rt.tokenizer.decode([int(t) for t in np.asarray(toks)[: int(n)]])


def _parse(resp, n=None, jit=False):
    f = lambda r, m: parse_form(r, m, OPS, FORMS, ACTS, ROWS, COLS, EOS, 4)  # noqa: E731
    f = jax.jit(f) if jit else f
    out = f(jnp.asarray(resp, jnp.int32), jnp.int32(len(resp) if n is None else n))
    return tuple(np.asarray(x).tolist() for x in out)


@pytest.mark.parametrize("jit", [False, True])
def test_parse_form_on_literal_responses(jit):
    # ADD FACT r1 c2 EOS: a fact entry of two tokens
    assert _parse([10, 21, 31, 42, 99, 0], jit=jit) == (0, FACT, [31, 42, 0, 0], 2, True)
    # UPDATE MOVES a b c EOS: the moves
    assert _parse([11, 20, 1, 2, 3, 99], jit=jit) == (1, MOVES, [1, 2, 3, 0], 3, True)
    # MOVES: the leading run of actions, clipped to entry_len; what follows it is ignored
    assert _parse([10, 20, 4, 4, 4, 4, 4, 4], jit=jit) == (0, MOVES, [4, 4, 4, 4], 4, True)
    assert _parse([10, 20, 2, 31, 3, 99], jit=jit) == (0, MOVES, [2, 0, 0, 0], 1, True)
    # RETURN whatever follows
    assert _parse([12, 21, 31, 99], jit=jit) == (2, MOVES, [0, 0, 0, 0], 0, True)
    # invalid: no form token, a FACT that is not a row then a column, an empty MOVES, no op first, empty
    for bad in ([10, 1, 2, 99], [10, 21, 41, 31, 99], [10, 21, 31, 99], [10, 20, 99], [20, 10, 1], [99, 10]):
        assert _parse(bad, jit=jit) == (2, MOVES, [0, 0, 0, 0], 0, False), bad
    # the length ends the response: FACT r0 with its column cut off
    assert _parse([10, 21, 30, 40], n=3, jit=jit)[-1] is False
    assert np.asarray(is_fact(jnp.asarray([[31, 42, 0], [1, 2, 0], [31, 0, 0]]), jnp.asarray([2, 2, 1]),
                              jnp.asarray(ROWS))).tolist() == [True, False, False]


def test_fact_tip_shows_the_cell_at_every_turn(rt):
    st, _ = rt.env.reset(jax.random.key(0), 1)
    obs, obs_len = rt.renderer(st)
    view = _decode(rt, obs, obs_len)
    r2, c3 = rt.tokenizer.extra_id("<r2>"), rt.tokenizer.extra_id("<c3>")
    fact = jnp.asarray([r2, c3, 0, 0, 0], jnp.int32)
    for t in (0, 3):  # the cell at every turn, also past the entry's length as a plan
        p, n = build_prompt(rt.train_task_tokens[1], rt.train_task_len[1], fact, jnp.int32(2), jnp.bool_(True),
                            rt.tiny.seg, t, obs, obs_len, turn_marker=True)
        assert _decode(rt, p, n) == f"<L1><t{t}>" + view + "<TIP><r2><c3><ACT>"
    a = [int(x) for x in rt.tiny.action_ids]
    moves = jnp.asarray([a[0], a[1], a[2], 0, 0], jnp.int32)  # a plan: the window from the turn on, as without forms
    p, n = build_prompt(rt.train_task_tokens[1], rt.train_task_len[1], moves, jnp.int32(3), jnp.bool_(True),
                        rt.tiny.seg, 1, obs, obs_len, turn_marker=True)
    assert _decode(rt, p, n) == "<L1><t1>" + view + "<TIP><east><south><ACT>"


def test_distill_prompt_shows_the_end_cell_after_the_moves(rt):
    a = [int(x) for x in rt.tiny.action_ids]
    ep = _Moves(action_tokens=jnp.asarray([[a[0], a[3], 0, 0]]), turns=jnp.asarray([2]))
    end = jnp.asarray([[rt.tokenizer.extra_id("<r1>"), rt.tokenizer.extra_id("<c2>")]], jnp.int32)
    p, n = distill_prompts(rt, rt.train_task_tokens[:1], rt.train_task_len[:1], ep, jnp.asarray([True]),
                           jnp.asarray([[a[1], 0, 0, 0, 0]]), jnp.asarray([1]), jnp.asarray([True]), end)
    pad = rt.tokenizer.decode([rt.tokenizer.pad_id])
    assert _decode(rt, p[0], n[0]) == f"<DISTIL><L0><OLD><east><MOVES><north><west>{pad}{pad}<r1><c2><SUCC><OP>"


def test_response_masks_put_the_form_after_the_op(rt):
    allowed = np.asarray(rt.tiny.response_allowed(5))
    ids = lambda m: set(np.nonzero(m)[0].tolist())  # noqa: E731
    t = rt.tiny
    cells = set(np.asarray(t.row_ids).tolist()) | set(np.asarray(t.col_ids).tolist())
    acts = set(np.asarray(t.action_ids).tolist())
    assert ids(allowed[0]) == set(np.asarray(t.op_ids).tolist())
    assert ids(allowed[1]) == set(np.asarray(t.form_ids).tolist())
    assert ids(allowed[2]) == acts | cells  # min_entry = 1 entry token before EOS
    assert ids(allowed[3]) == acts | cells | set(np.asarray(t.op_ids).tolist()) | {rt.tokenizer.eos_id}


def test_goto_targets_on_a_literal_grid():
    deltas, is_move = prior_forms.move_deltas(DIR_NAMES)
    g = np.full((5, 5), G_FLOOR, np.int32)
    g[2, 2] = G_AGENT
    g[1, 2] = G_WALL  # north is a wall
    p = np.asarray(prior_forms.goto_moves(jnp.asarray(g), jnp.asarray([0, 2]), deltas, is_move))
    # to (0, 2): north (blocked), northeast, northwest reduce the distance -> northeast, northwest
    want = np.zeros(8)
    want[[DIR_NAMES.index("northeast"), DIR_NAMES.index("northwest")]] = 0.5
    np.testing.assert_allclose(p, want)
    # at the top-left corner, target (0, 4): east and southeast (northeast would leave the grid: stone)
    g = np.full((5, 5), G_FLOOR, np.int32)
    g[0, 0] = G_AGENT
    p = np.asarray(prior_forms.goto_moves(jnp.asarray(g), jnp.asarray([0, 4]), deltas, is_move))
    assert p.tolist() == [0.5 if n in ("east", "southeast") else 0.0 for n in DIR_NAMES]
    # walled in on the target's side: the unblocked moves that come closest (south-east, east blocked -> south)
    g[0, 1] = G_WALL
    g[1, 1] = G_BLANK
    p = np.asarray(prior_forms.goto_moves(jnp.asarray(g), jnp.asarray([0, 4]), deltas, is_move))
    assert p.tolist() == [1.0 if n == "south" else 0.0 for n in DIR_NAMES]
    # on the target: no target
    assert np.asarray(prior_forms.goto_moves(jnp.asarray(g), jnp.asarray([0, 0]), deltas, is_move)).sum() == 0


def _rows(fn, rt, seed, n):
    """`fn(rt, key(seed), n)` jitted (the eager vmap of a row builder is slow)."""
    return jax.jit(lambda k: fn(rt, k, n))(jax.random.key(seed))


def test_prior_rows_teach_both_forms_and_never_pair_a_level_with_a_fact(rt):
    """Every fact the data shows (a FACT tip, an end cell) is drawn independently of the row's level token:
    the data does not change with the level pools, and no level token comes with one fact only."""
    other = build(load(None, MICRO + ["env.pool_seed=7"]))
    for fn in (pretrain.actor_rows, pretrain.extractor_rows):
        ra, rb = _rows(fn, rt, 3, 32), _rows(fn, other, 3, 32)
        for x, y in zip(jax.tree_util.tree_leaves(ra), jax.tree_util.tree_leaves(rb)):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    tok = rt.tokenizer
    level_ids = {tok.extra_id(f"<{p}{i}>") for p in "LE" for i in range(4)}
    rows, cols = set(np.asarray(rt.tiny.row_ids).tolist()), set(np.asarray(rt.tiny.col_ids).tolist())
    tip, fact_id = tok.extra_id("<TIP>"), tok.extra_id("<FACT>")
    seen = {}
    ar = _rows(pretrain.actor_rows, rt, 0, 512)
    n_fact = 0
    for i in range(512):
        t = np.asarray(ar.tokens[i])[: int(ar.lengths[i])].tolist()
        if tip in t and t[t.index(tip) + 1] in rows:
            n_fact += 1
            cell = tuple(t[t.index(tip) + 1: t.index(tip) + 3])
            seen.setdefault(t[0], set()).add(cell)
            tgt = np.asarray(ar.target[i])
            assert tgt.sum() == 0 or abs(tgt.sum() - 1) < 1e-6
    er = _rows(pretrain.extractor_rows, rt, 1, 256)
    forms = {"<MOVES>": 0, "<FACT>": 0}
    for i in range(256):
        t = np.asarray(er.tokens[i]).tolist()
        s = int(er.lengths[i])  # the op token's position; the form follows it
        forms[tok.decode([t[s + 1]])] += 1
        end = [j for j in range(s) if t[j] in rows]
        assert len(end) == 1 and t[end[0] + 1] in cols  # the end cell, once, in the prompt
        if t[s + 1] == fact_id:
            assert t[s + 2: s + 4] == t[end[0]: end[0] + 2] and t[s + 4] == tok.eos_id  # the end cell copied
        seen.setdefault(t[1], set()).add(tuple(t[end[0]: end[0] + 2]))
    assert n_fact > 100 and min(forms.values()) > 90
    assert set(seen) <= level_ids and len(seen) == 8
    assert all(len(v) > 1 for v in seen.values())  # no level token paired with a single fact
    np.testing.assert_allclose(np.asarray(er.form_target)[:, np.asarray(rt.tiny.form_ids)], 0.5)


def _episodes(rt, success):
    a = [int(x) for x in rt.tiny.action_ids]
    r, c = rt.tokenizer.extra_id, rt.tokenizer.extra_id
    n = len(success)
    acts = jnp.asarray([[a[0], a[1], a[2], 0], [a[3], a[3], 0, 0], [a[4], 0, 0, 0]][:n], jnp.int32)
    end = jnp.asarray([[r("<r0>"), c("<c1>")], [r("<r2>"), c("<c3>")], [r("<r4>"), c("<c0>")]][:n], jnp.int32)
    z = jnp.zeros((n, 4), jnp.int32)
    return Episodes(prompts=z[:, :, None], prompt_len=z, action_tokens=acts, actions=z, logp=z.astype(jnp.float32),
                    active=z.astype(bool), reward=jnp.asarray(success, jnp.float32),
                    success=jnp.asarray(success), turns=jnp.asarray([3, 2, 1][:n], jnp.int32), end_cell=end)


@pytest.mark.parametrize("fact", [False, True])
def test_archives_write_literal_entries(rt, fact):
    ep = _episodes(rt, [True, False, True])
    keys = jnp.eye(3, rt.cfg.bank.key_dim, dtype=jnp.float32)
    b = rt.bank_ops.init()
    out = archive(rt, b, None, jax.random.key(0), jnp.int32(0), episodes=ep, keys=keys,
                  slots=jnp.full((3,), -1, jnp.int32), fact=fact)
    bank = out.bank
    got = [_decode(rt, bank.tokens[i], bank.lengths[i]) for i in range(int(bank_lib.size(bank)))]
    assert got == (["<r0><c1>", "<r4><c0>"] if fact else ["<north><east><south>", "<northeast>"])
    assert (np.asarray(out.facts).tolist() == [1, 0, 1]) if fact else out.facts is None
    assert np.asarray(out.adds).tolist() == [1, 0, 1] and int(out.n_add) == 2
    assert (np.asarray(bank.source)[: len(got)] == -1).all()


def test_fact_share_metrics():
    m = diagnostics.fact_shares(jnp.asarray([1, 0, 1, 0]), jnp.asarray([1, 1, 1, 0]))
    assert float(m["forms_fact"]) == 2 and abs(float(m["forms_fact_share"]) - 2 / 3) < 1e-6
    assert np.isnan(float(diagnostics.fact_shares(jnp.zeros(2, int), jnp.zeros(2, int))["forms_fact_share"]))


def test_default_vocabulary_and_prior_id_are_unchanged():
    """The option adds <FACT> after every other token (their ids unchanged) and has its own prior id; off, the
    vocabulary holds no <FACT> and the default's prior id is the shipped prior's (test_effect_mechanisms)."""
    base = compact_vocabulary(4, 4, 5, (5, 5))
    assert "<FACT>" not in base and base[-len(MARKERS):] == MARKERS
    assert compact_vocabulary(4, 4, 5, (5, 5), forms=True) == base + ("<FACT>",)
    d, f = load(None, []), load(None, ["extraction.forms=true"])
    assert pretrain.prior_id(d) != pretrain.prior_id(f)
    rd, rf = build(d), build(f)
    assert rf.vocab_size == rd.vocab_size + 1 and "<FACT>" not in rd.tokenizer.extra_tokens
    assert rd.tiny.form_ids is None and rd.tiny.seg.fact_rows is None and len(rd.tiny.response_masks()) == 3


@pytest.mark.parametrize("bad", [["rollout.view=text"], ["extraction.merge=true"], ["rollout.tip_window=1"]])
def test_forms_config_checks(bad):
    with pytest.raises(ConfigError, match="extraction.forms"):
        load(None, ["extraction.forms=true"] + bad)
    with pytest.raises(ConfigError, match="method"):
        load(None, ["method=oracle_archive"])
