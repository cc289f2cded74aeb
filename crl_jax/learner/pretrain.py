"""Priors of the tiny models (METHOD.md §6): what a pretrained LLM brings, learned from synthetic data.

The paper's actor can read a tip and its extractor can write one before RL starts; tiny transformers
trained from scratch can do neither, and RL alone does not teach them in a short run. `prior_params(rt)`
trains both on **synthetic data only** and returns their parameters; every method (GRPO included)
starts from the same prior when `pretrain.enabled`.

The data is a pure function of a key, the action vocabulary and the prompt layout: random action
sequences and random observations rendered into the prompt layouts. It never holds a level's solution,
never calls a solver, and does not read the level pools (changing `env.pool_seed` leaves it unchanged;
a test asserts it):

- actor rows: a random task segment, turn, observation (random glyph grid with the hero somewhere) and,
  with probability `tip_p`, a random plan as the tip. Target: the plan's move for this turn when a tip
  is shown, else the uniform distribution over actions (free and GRPO behaviour start unbiased).
- extractor rows: a distillation prompt with random moves, outcome and (half the time) an old tip.
  Target: the operation is uniform over ADD / RETURN (and UPDATE when an old tip is shown), and after
  ADD or UPDATE the entry is a copy of the moves, then EOS. What to copy, when to return and which
  entries help are left to RL.
- with the entry forms (`extraction.forms`, `learner.prior_forms`): half the actor's tips name a cell to go
  to (target: the moves towards it that avoid what the view shows blocked), and the extractor writes the
  moves or the episode's end cell after a form token drawn uniformly.
- merge rows (extractor, pretraining only): a merge prompt with random entries; target ADD + a copy of
  the chunk's newest entry (a no-loss merge of duplicates), then EOS.

`actor_rows` / `extractor_rows` also feed the prior-preserving auxiliary loss (`pretrain.aux_coef`),
which keeps these skills during RL (measured: RL alone erodes them within ~20 steps). The auxiliary rows
keep only the skills (copy the tip's move; copy the moves), not the uniform targets, which stand for
"unbiased at the start": the tipless policy and the ADD / RETURN choice are what RL shapes.

Priors are cached on disk (`pretrain.cache_dir`), keyed by a hash of everything that shapes them
(`prior_id`); a run records the id it started from.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from crl_jax.actor.rollout import build_prompt
from crl_jax.envs.base import G_BLANK, G_DOWN, G_FLOOR, G_UP, G_WALL
from crl_jax.envs.compact import probe_obs
from crl_jax.extractor.distill import distill_prompts
from crl_jax.extractor.merge_step import merge_prompt_len, merge_response_len
from crl_jax.learner import prior_forms
from crl_jax.learner.loss_fns import PriorRows, actor_prior_loss, extractor_prior_loss
from crl_jax.models import transformer as tr
from crl_jax.text.packing import pack_segments

ADD, UPDATE, RETURN = 0, 1, 2
PRIOR_VERSION = 3  # bump when the synthetic data or a prompt layout changes: old caches then miss
_CELLS = np.array([G_BLANK, G_FLOOR, G_FLOOR, G_DOWN, G_UP, G_WALL], np.int32)  # glyphs of random grids


def _random_obs(rt, key):
    """A random observation: glyph grid of the env's shape (`_CELLS` glyphs) with the hero on one cell, no message."""
    return prior_forms.random_grid_obs(key, probe_obs(rt.env), _CELLS)


def _task_rows(rt):
    """Every task segment of both pools (the segments name a level's index, never its content)."""
    return (jnp.concatenate([rt.train_task_tokens, rt.eval_task_tokens]),
            jnp.concatenate([rt.train_task_len, rt.eval_task_len]))


def _random_plan(rt, key, max_len: int):
    """(tokens [entry_len] of random action tokens, length in [1, max_len])."""
    L = rt.cfg.bank.entry_len
    k1, k2 = jax.random.split(key)
    n = jax.random.randint(k2, (), 1, max_len + 1)
    toks = rt.tiny.action_ids[jax.random.randint(k1, (L,), 0, rt.tiny.action_ids.shape[0])]
    return jnp.where(jnp.arange(L) < n, toks, 0).astype(jnp.int32), n.astype(jnp.int32)


def actor_rows(rt, key, n: int, only_tips: bool = False) -> PriorRows:
    """`n` synthetic actor rows: prompt of one turn, target = the tip's move or uniform. `only_tips`: every
    row has a tip and rows whose tip is used up get no target (the auxiliary loss: it keeps the copy skill
    without pulling tipless behaviour, which RL is shaping, back to uniform)."""
    tt, tl = _task_rows(rt)
    V = rt.vocab_size
    A = rt.tiny.action_ids.shape[0]
    T = rt.num_turns
    tip_p = 1.0 if only_tips else rt.cfg.pretrain.tip_p
    uniform = jnp.zeros((V,), jnp.float32).at[rt.tiny.action_ids].set(1.0 / A)
    forms = rt.tiny.form_ids is not None

    def one(k):
        ks = jax.random.split(k, 5)
        task = jax.random.randint(ks[0], (), 0, tt.shape[0])
        t = jax.random.randint(ks[1], (), 0, T)
        plan, plen = _random_plan(rt, ks[2], min(T, rt.cfg.bank.entry_len))
        has = jax.random.uniform(ks[3]) < tip_p
        raw_obs, shown = _random_obs(rt, ks[4]), has & (t < plen)
        tip_target = jnp.zeros((V,), jnp.float32).at[plan[jnp.minimum(t, plan.shape[0] - 1)]].set(1.0)
        if forms:  # some tips name a cell to go to (a FACT tip, shown at every turn: `prior_forms.goto_row`)
            fact, (plan, plen, raw_obs, tip_target) = prior_forms.maybe_goto(rt, jax.random.fold_in(k, 5), plan, plen,
                                                                             raw_obs, tip_target)
            shown = has & (fact | (t < plen))
        obs, obs_len = rt.renderer(raw_obs)
        prompt, length = build_prompt(tt[task], tl[task], plan, plen, has, rt.tiny.seg, t, obs, obs_len,
                                      turn_marker=rt.cfg.rollout.turn_marker)
        target = jnp.where(shown, tip_target, 0.0 if only_tips else uniform)
        return prompt, length, target

    p, l, tgt = jax.vmap(one)(jax.random.split(key, n))
    return PriorRows(tokens=p, lengths=l, target=tgt)


def _teacher_forced(prompt, plen, response, rlen, width: int):
    """prompt ++ response packed into [width] -> (tokens, response start, hard mask of response[1:])."""
    toks, total = pack_segments([(prompt, plen), (response, rlen)], size=width)
    t = jnp.arange(width)
    return toks, plen, (t > plen) & (t < total)


def _response(rt, op_token, entry, entry_len, budget: int, form_token=None):
    """[budget] = op token, [form token,] entry[:entry_len], EOS (cut to the budget) -> (tokens, length)."""
    eos = jnp.asarray([rt.tokenizer.eos_id], jnp.int32)
    form = [] if form_token is None else [(form_token[None], jnp.int32(1))]
    return pack_segments([(op_token[None], jnp.int32(1)), *form, (entry, entry_len), (eos, jnp.int32(1))], size=budget)


def extractor_rows(rt, key, n: int, op_weight: float = 1.0) -> PriorRows:
    """`n` synthetic distillation rows (`distill.distill_prompts`, the loop's own layout): random moves ->
    soft op target, then a copy of the moves and EOS. `op_weight` scales the op target (the auxiliary loss
    uses `pretrain.aux_op_weight`: the choice between ADD and RETURN is what RL shapes)."""
    cfg = rt.cfg
    tt, tl = _task_rows(rt)
    V = rt.vocab_size
    R = cfg.extraction.max_new_tokens
    L = cfg.bank.entry_len
    T = rt.num_turns
    ks = jax.random.split(key, 7)
    task = jax.random.randint(ks[0], (n,), 0, tt.shape[0])
    moves, n_moves = jax.vmap(lambda k: _random_plan(rt, k, min(T, L)))(jax.random.split(ks[1], n))
    moves_t = jnp.pad(moves, ((0, 0), (0, max(0, T - L))))[:, :T]
    ok = jax.random.bernoulli(ks[2], 0.5, (n,))
    old, old_len = jax.vmap(lambda k: _random_plan(rt, k, L))(jax.random.split(ks[3], n))
    has_old = jax.random.bernoulli(ks[4], 0.5, (n,))
    ep = _Moves(action_tokens=moves_t, turns=n_moves)
    forms = rt.tiny.form_ids is not None  # write the moves or the end cell (shown after the moves), the form uniform
    end_cell, form, entry, entry_len = (prior_forms.form_response_parts(rt, jax.random.fold_in(key, 7), n, moves,
                                                                        n_moves) if forms else
                                        (None, None, moves, n_moves))
    prompts, plen = distill_prompts(rt, tt[task], tl[task], ep, ok, old, jnp.where(has_old, old_len, 0), has_old,
                                    end_cell)
    # The op token written in the teacher-forced sequence: ADD, or UPDATE half the time with an old tip.
    upd = has_old & jax.random.bernoulli(ks[5], 0.5, (n,))
    op_tok = jnp.where(upd, rt.tiny.op_ids[UPDATE], rt.tiny.op_ids[ADD])
    resp, rlen = jax.vmap(lambda o, m, k, f: _response(rt, o, m, k, R, f))(op_tok, entry, entry_len, form)
    toks, start, hard = jax.vmap(lambda p, pl, r, rl: _teacher_forced(p, pl, r, rl, prompts.shape[1] + R))(
        prompts, plen, resp, rlen)
    target = jnp.zeros((n, V), jnp.float32).at[:, rt.tiny.op_ids[ADD]].set(1.0).at[:, rt.tiny.op_ids[RETURN]].set(1.0)
    target = jnp.where(has_old[:, None], target.at[:, rt.tiny.op_ids[UPDATE]].set(1.0), target)
    target = target / target.sum(-1, keepdims=True)
    return PriorRows(tokens=toks, lengths=start, target=op_weight * target, hard=hard, response_width=R,
                     form_target=prior_forms.form_target(rt, n, op_weight) if forms else None)


class _Moves(NamedTuple):
    action_tokens: jax.Array  # [n, T]
    turns: jax.Array  # [n]


def merge_rows(rt, key, n: int) -> PriorRows:
    """`n` synthetic merge rows (the merge layout with random entries): ADD + a copy of the newest entry."""
    cfg = rt.cfg
    p = rt.merge_pieces
    V = rt.vocab_size
    C = cfg.extraction.merge_chunk
    L = cfg.bank.entry_len
    P = merge_prompt_len(cfg, p)
    R = merge_response_len(cfg)
    fixed = cfg.rollout.view == "compact"  # as `merge_family(fixed_width=...)` lays entries out

    def one(k):
        ks = jax.random.split(k, C + 1)
        m = jax.random.randint(ks[0], (), 1, C + 1)  # entries in the chunk
        entries = [_random_plan(rt, ks[j + 1], L) for j in range(C)]
        segs = [p.header, p.entries]
        for j, (e, el) in enumerate(entries):
            e = jnp.where(jnp.arange(L) < el, e, rt.tokenizer.pad_id) if fixed else e
            segs += [(p.sep[0], jnp.where(j < m, p.sep[1], 0)), (e, jnp.where(j < m, L if fixed else el, 0))]
        segs.append(p.suffix)
        prompt, plen = pack_segments(segs, size=P, pad_id=rt.tokenizer.pad_id)
        last_tok = jnp.stack([e for e, _ in entries])[m - 1]
        last_len = jnp.stack([el for _, el in entries])[m - 1]
        resp, rlen = _response(rt, rt.tiny.op_ids[ADD], last_tok, last_len, R)
        toks, start, hard = _teacher_forced(prompt, plen, resp, rlen, P + R)
        return toks, start, jnp.zeros((V,), jnp.float32).at[rt.tiny.op_ids[ADD]].set(1.0), hard

    toks, start, tgt, hard = jax.vmap(one)(jax.random.split(key, n))
    return PriorRows(tokens=toks, lengths=start, target=tgt, hard=hard, response_width=R)


# ------------------------------------------------------------------------------------------------
# Training and the cache


def prior_id(cfg) -> str:
    """Hash of everything that shapes the prior (not the level pools, seeds, methods or RL settings)."""
    c = cfg
    shape = lambda m: {k: getattr(m, k) for k in ("preset", "hidden_size", "num_layers", "num_heads",  # noqa: E731
                                                  "num_kv_heads", "intermediate_size", "dtype", "temperature")}
    key = dict(env={"name": c.env.name, "params": c.env.params, "num_train_tasks": c.env.num_train_tasks,
                    "num_eval_tasks": c.env.num_eval_tasks, "max_turns": c.env.max_turns,
                    "task_ids_in_text": c.env.task_ids_in_text},
               # share_prefix and turn_block only change how a turn's forward is computed (equal to ~1e-6)
               rollout={k: v for k, v in dataclasses.asdict(c.rollout).items()
                        if k not in ("share_prefix", "turn_block")},
               actor=shape(c.actor), extractor=shape(c.extractor),
               entry_len=c.bank.entry_len,
               extraction={k: getattr(c.extraction, k) for k in ("max_new_tokens", "prompt_len", "min_entry",
                                                                 "merge_chunk", "temperature")},
               pretrain={k: v for k, v in dataclasses.asdict(c.pretrain).items()
                         if k not in ("enabled", "aux_coef", "aux_rows", "extractor_aux_rows", "aux_op_weight",
                                      "cache_dir")}, version=PRIOR_VERSION)
    if c.extraction.outcome_last:  # the distillation layout (only when set: the default's id, and so the
        key["outcome_last"] = True  # shipped prior, stay unchanged)
    if c.extraction.forms:  # the entry forms' vocabulary, layouts and data (likewise only when set)
        key["forms"] = True
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cache_dir(cfg) -> str:
    return cfg.pretrain.cache_dir or os.environ.get("CRL_JAX_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "crl_jax", "priors")


def _fit(loss_fn, params, key, steps: int, lr: float, log_every: int = 0, log=None):
    """`steps` Adam steps of loss_fn(params, key_i) (one compiled scan) -> (params, losses [steps])."""
    tx = optax.adam(lr)

    def body(carry, k):
        p, o = carry
        loss, g = jax.value_and_grad(loss_fn)(p, k)
        u, o = tx.update(g, o, p)
        return (optax.apply_updates(p, u), o), loss

    (params, _), losses = jax.jit(lambda p, ks: jax.lax.scan(body, (p, tx.init(p)), ks))(
        params, jax.random.split(key, steps))
    return params, losses


def train_prior(rt, key=None):
    """-> ({"actor": params, "extractor": params}, metrics): both priors from fresh inits."""
    pc = rt.cfg.pretrain
    key = jax.random.key(pc.seed) if key is None else key
    k_a, k_e, k_da, k_de = jax.random.split(key, 4)
    a_gd, a_p = tr.split(tr.create(rt.actor_config, k_a))
    e_gd, e_p = tr.split(tr.create(rt.extractor_config, k_e))
    allowed = jnp.zeros((rt.vocab_size,), bool).at[rt.tiny.action_ids].set(True)
    temp = rt.cfg.actor.temperature
    a_p, a_loss = _fit(lambda p, k: actor_prior_loss(a_gd, p, actor_rows(rt, k, pc.batch), allowed, temp),
                       a_p, k_da, pc.actor_steps, pc.lr)
    masks = rt.tiny.response_masks()
    m = rt.cfg.extraction.min_entry
    et = rt.cfg.extraction.temperature

    def e_loss(p, k):
        k1, k2 = jax.random.split(k)
        loss = extractor_prior_loss(e_gd, p, extractor_rows(rt, k1, pc.batch), masks, m, et)
        if rt.cfg.extraction.merge:
            loss = loss + extractor_prior_loss(e_gd, p, merge_rows(rt, k2, max(pc.batch // 8, 1)), masks, m, et)
        return loss

    e_p, e_loss_v = _fit(e_loss, e_p, k_de, pc.extractor_steps, pc.lr)
    metrics = {"actor_loss_first": float(a_loss[0]), "actor_loss_last": float(a_loss[-10:].mean()),
               "extractor_loss_first": float(e_loss_v[0]), "extractor_loss_last": float(e_loss_v[-10:].mean())}
    return {"actor": a_p, "extractor": e_p}, metrics


_MEMO: dict[str, dict] = {}


def _save(path: str, params: dict, meta: dict):
    leaves = jax.tree_util.tree_leaves(params)
    tmp = f"{path[:-4]}.{os.getpid()}.tmp.npz"  # per process: two writers of one prior (test workers) never share it
    np.savez(tmp, **{f"leaf{i}": np.asarray(x) for i, x in enumerate(leaves)})
    os.replace(tmp, path)
    tmp_meta = f"{path[:-4]}.{os.getpid()}.tmp.json"
    with open(tmp_meta, "w") as f:
        json.dump(meta, f, indent=2)
    os.replace(tmp_meta, path[:-4] + ".json")


def load_params(path: str, template: dict):
    """Params saved by `_save` at `path`, shaped like `template` (a ValueError names a shape mismatch)."""
    leaves, treedef = jax.tree_util.tree_flatten(template)
    with np.load(path) as z:
        arrs = [z[f"leaf{i}"] for i in range(len(leaves))]
    for a, t in zip(arrs, leaves):
        if a.shape != t.shape:
            raise ValueError(f"prior cache {path}: leaf shape {a.shape} != {t.shape}")
    return jax.tree_util.tree_unflatten(treedef, [jnp.asarray(a, t.dtype) for a, t in zip(arrs, leaves)])


_load = load_params  # the name the LLM format prior's probes import


def cached_or_trained(path: str, template, train, *, what: str, id_key: str, pid: str, log=None):
    """The params of `path` (an npz shaped like `template`), or `train()` -> (params, metrics) saved there.

    Shared by the tiny prior and the LLM format prior. Training takes a minute or more, once per id: it is
    announced on stderr (or through `log`) rather than stalling a progress bar silently."""
    say = log or (lambda m: print(m, file=sys.stderr, flush=True))
    if os.path.exists(path):
        try:
            return load_params(path, template)
        except (OSError, ValueError, KeyError) as e:
            say(f"{what} cache {path} unreadable ({e}); retraining")
    say(f"training the {what} {pid} (synthetic data only, once; cached in {os.path.dirname(path)})")
    params, metrics = train(say)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    _save(path, params, {id_key: pid, **metrics})
    return params


SHIPPED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "priors")  # priors shipped with the package


def shipped_path(pid: str) -> str:
    """Where the package ships the prior `pid` (the embedded default's, so a fresh machine skips the fit)."""
    return os.path.join(SHIPPED_DIR, f"prior-{pid}.npz")


def prior_params(rt, log=None, *, refit: bool = False) -> dict:
    """The prior of `rt.cfg` ({"actor", "extractor"} params): from the cache, else the copy the package ships
    for this id (the embedded default's: the same function of the same key, fitted once), else trained on
    first use and cached. `refit`: train into the cache even if a cached or shipped copy exists."""
    pid = prior_id(rt.cfg)
    if pid in _MEMO and not refit:
        return _MEMO[pid]
    template = {"actor": tr.split(tr.create(rt.actor_config, jax.random.key(0)))[1],
                "extractor": tr.split(tr.create(rt.extractor_config, jax.random.key(0)))[1]}
    path = os.path.join(cache_dir(rt.cfg), f"prior-{pid}.npz")
    if refit:
        for p in (path, path[:-4] + ".json"):
            if os.path.exists(p):
                os.remove(p)
    elif not os.path.exists(path) and os.path.exists(shipped_path(pid)):
        try:
            _MEMO[pid] = load_params(shipped_path(pid), template)
            return _MEMO[pid]
        except (OSError, ValueError, KeyError) as e:  # a damaged install: fit into the cache instead
            (log or (lambda m: print(m, file=sys.stderr, flush=True)))(f"shipped prior unreadable ({e}); retraining")
    _MEMO[pid] = cached_or_trained(path, template, lambda say: train_prior(rt), what="prior", id_key="prior_id",
                                   pid=pid, log=log)
    return _MEMO[pid]


def prior_meta_path(cfg) -> str:
    """The metadata file (id, first / last losses) of the prior a config starts from (cache, else shipped)."""
    pid = prior_id(cfg)
    own = os.path.join(cache_dir(cfg), f"prior-{pid}.json")
    return own if os.path.exists(own) or not os.path.exists(shipped_path(pid)[:-4] + ".json") \
        else shipped_path(pid)[:-4] + ".json"


def _stacked(rows: PriorRows, steps: int) -> PriorRows:
    """[steps * n] rows -> [steps, n] (one slice per optimizer step); unchanged for steps == 1."""
    if steps == 1:
        return rows
    return jax.tree_util.tree_map(lambda x: x.reshape(steps, -1, *x.shape[1:]), rows)


def aux_actor_rows(rt, key, steps: int = 1):
    """The actor's auxiliary-loss rows of one iteration ([steps] leading axis when steps > 1), or None
    when the auxiliary loss is off: fresh synthetic tip rows for every optimizer step."""
    pc = rt.cfg.pretrain
    if not (pc.enabled and pc.aux_coef) or key is None:
        return None
    return _stacked(actor_rows(rt, key, pc.aux_rows * steps, only_tips=True), steps)


def aux_extractor_rows(rt, key, steps: int = 1):
    """The extractor's auxiliary-loss rows (copy, and the op target weighted by `aux_op_weight`), or None."""
    pc = rt.cfg.pretrain
    if not (pc.enabled and pc.aux_coef) or key is None:
        return None
    return _stacked(extractor_rows(rt, key, pc.extractor_aux_rows * steps, op_weight=pc.aux_op_weight), steps)
