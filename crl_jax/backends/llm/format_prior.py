"""The format prior of the LLM path (METHOD.md §6): LoRA steps on synthetic replies, merged into the
starting weights of every method.

A 135M instruct model reads the loop's prompts but often answers in free prose. Before RL, a few
supervised LoRA steps teach the *formats* only, under the priors' rule:

- data are synthetic and a pure function of a key, the action names and the prompt layout: the loop's
  own prompt pieces (`crl_jax.backends.llm.prompt_pieces`, the same templates and prefills) around **random**
  boards (random glyph grids, `crl_jax.learner.pretrain._random_obs`) and random level names of either pool
  (an index, never a level's content); targets are a **random legal move** in the answer format, and a
  JSON list holding one `add` of **random lesson words** or a `return`. No solver, no level layout, no
  level's solution: nothing here can tell a good move from a bad one, so every move stays as likely as
  the base model made it relative to the others... except through the format;
- the adapters (`crl_jax.models.lora`) of actor and extractor train on ONE frozen base when both are the
  same checkpoint (they are in the SmolLM2 preset); the merged weights base + (alpha/r) B A are the
  starting weights of every method (GRPO included);
- deterministic from `format_prior.seed`, cached on disk (`crl_jax.learner.pretrain`'s cache folder and
  save / load helpers) under `format_prior_id(cfg)`, a hash of everything that shapes it (checkpoint,
  prompts and their variants, env rendering, LoRA and prior settings; not the level pools' seed, the
  run seed or the method); a run records the id in its summary (`prior`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from crl_jax.backends.llm import host_prior
from crl_jax.backends.llm.host_prior import is_host
from crl_jax.backends.llm.prior_rows import (ADD_P, MAX_PRIOR_TURNS, actor_row, distill_budget, op_reply, pick,
                                          reply_width, rt_tables, teacher_forced)
from crl_jax.backends.llm.prompt_pieces import distill_prompt
from crl_jax.envs.adapters import names as adapter_names
from crl_jax.models import lora
from crl_jax.models import transformer as tr
from crl_jax.text import prompts
from crl_jax.text.packing import pack_segments
from crl_jax.learner.pretrain import _load, _random_obs, cache_dir, cached_or_trained  # noqa: F401  (_load: probes)

FORMAT_PRIOR_VERSION = 2  # bump when the synthetic data or the loss change: old caches then miss
# v2: the extractor's op token is scored against the data's op distribution (ADD_P add, 1 - ADD_P return)
# on every row, not against the row's own draw (see `op_target`); v1 learnt `return` only
LORA_SHAPE_KEYS = ("rank", "alpha", "targets")  # the lora.* keys that shape the prior (not how RL trains)


def actor_rows(rt, key, n: int):
    """`n` one-turn actor rows: the loop's head (half with a random lesson as experience) and first turn
    on a random board, target = a random move in the answer format -> (tokens [n, W], mask [n, W])."""
    if is_host(rt):
        return host_prior.actor_rows(rt, key, n)
    t = rt_tables(rt)
    tt = jnp.concatenate([rt.train_task_tokens, rt.eval_task_tokens])
    tl = jnp.concatenate([rt.train_task_len, rt.eval_task_len])

    def one(k):
        ks = jax.random.split(k, 5)
        obs, obs_len = rt.renderer(_random_obs(rt, ks[3]))
        reply, rlen = pack_segments([pick(t["moves"], ks[4]), t["move_close"]])
        return actor_row(rt, ks, tt, tl, obs, obs_len, reply, rlen)

    return jax.vmap(one)(jax.random.split(key, n))


def extractor_rows(rt, key, n: int):
    """`n` distillation rows: 1..2 random moves on random boards, random outcome, no retrieved entry;
    target = one `add` of a random lesson (2/3) or a `return` (1/3) in the JSON answer format."""
    if is_host(rt):
        return host_prior.extractor_rows(rt, key, n)
    dp = rt.llm.distill_pieces
    T = dp.num_turns
    tt = jnp.concatenate([rt.train_task_tokens, rt.eval_task_tokens])
    tl = jnp.concatenate([rt.train_task_len, rt.eval_task_len])
    budget = distill_budget(rt)
    A = len(rt.env.action_names)

    def one(k):
        ks = jax.random.split(k, 7)
        task = jax.random.randint(ks[0], (), 0, tt.shape[0])
        obs, obs_len = jax.vmap(lambda kk: rt.renderer(_random_obs(rt, kk)))(jax.random.split(ks[1], T))
        turns = jax.random.randint(ks[2], (), 1, min(MAX_PRIOR_TURNS, T) + 1)
        active = jnp.arange(T) < turns
        acts = jax.random.randint(ks[3], (T,), 0, A)
        entry = jnp.zeros((rt.cfg.bank.entry_len,), jnp.int32)
        seg = rt.llm.extractor_segment  # the actor's goal and observations in the extractor's tokens
        (goal, goal_len), (obs, obs_len) = seg(tt[task], tl[task]), jax.vmap(seg)(obs, obs_len)
        prompt, plen = distill_prompt(dp, budget, goal, goal_len, obs, obs_len, acts, active,
                                      jax.random.uniform(ks[4]) < 0.5, entry, jnp.int32(0), jnp.bool_(False),
                                      rt.extractor_tokenizer.pad_id)
        reply, rlen = op_reply(rt, ks[5], ks[6])
        return teacher_forced(prompt, plen, reply, rlen, budget + reply_width(rt))

    return jax.vmap(one)(jax.random.split(key, n))


# ------------------------------------------------------------------------------------------------
# Fit, cache, starting weights


def reply_cap(rt, which: str) -> int:
    """Static room of a synthetic target (tokens): the loss scores only these positions."""
    if which != "actor":
        return reply_width(rt)
    if is_host(rt):
        return host_prior.host_samples(rt).replies.shape[2]
    t = rt_tables(rt, which)
    return int(t["moves"][0].shape[1] + t["move_close"][0].shape[0])


def op_target(rt):
    """(offset, ids [2], probs [2]): the extractor target's op token — the first token where the `add` and
    the `return` targets differ (offset from the target's start) — its two ids and the data's op
    distribution (ADD_P, 1 - ADD_P)."""
    t = rt_tables(rt, "extractor")
    (a, na), (r, nr) = t["add_open"], t["return"]
    a, r = np.asarray(a)[:int(na)].tolist(), np.asarray(r)[:int(nr)].tolist()
    off = next(i for i in range(min(len(a), len(r))) if a[i] != r[i])
    return off, np.array([a[off], r[off]], np.int32), np.array([ADD_P, 1.0 - ADD_P], np.float32)


def nll(graphdef, params, tokens, mask, cap: int, soft=None):
    """Mean negative log-likelihood of the masked target tokens (teacher forcing). Only the `cap`
    positions from the target's start are unembedded: [B, cap, V] logits instead of [B, W, V] (the
    prompts are ~20x longer than the targets; V = 49,152 for SmolLM2).

    `soft` = (offset, ids [K], probs [K]) (`op_target`): the token at `offset` from the target's start is
    scored by the cross-entropy against the distribution `probs` over `ids` instead of the row's own
    draw (the expected loss over the draw: its optimum is `probs` on every row, whatever the few rows of
    a batch drew; the tokens after it stay teacher-forced on the row's draw)."""
    model = tr.merge(graphdef, params)
    h = model(tokens, return_hidden=True)  # [B, W, H]
    start = jnp.argmax(mask, axis=1)  # first target position
    pos = jnp.clip(start[:, None] - 1 + jnp.arange(cap)[None, :], 0, tokens.shape[1] - 2)  # predicts pos + 1
    logits = model.unembed(jnp.take_along_axis(h, pos[..., None], axis=1))  # [B, cap, V] float32
    tgt = jnp.take_along_axis(tokens, pos + 1, axis=1)
    m = jnp.take_along_axis(mask, pos + 1, axis=1) & (start[:, None] - 1 + jnp.arange(cap)[None, :] == pos)
    lse = jax.nn.logsumexp(logits, -1)
    lp = jnp.take_along_axis(logits, tgt[..., None], -1)[..., 0] - lse
    if soft is not None:
        off, ids, probs = soft
        op_lp = (jnp.asarray(probs) * (logits[:, off][:, jnp.asarray(ids)] - lse[:, off, None])).sum(-1)  # [B]
        lp = lp.at[:, off].set(op_lp)
    m = m.astype(jnp.float32)
    return -(lp * m).sum() / jnp.maximum(m.sum(), 1.0)


def fit(graphdef, base, adapters, rows_fn, key, steps: int, lr: float, s: float, cap: int, soft=None):
    """`steps` Adam steps on the adapters only (base frozen, an argument of the compiled step, never
    updated) -> (adapters, losses [steps]); `soft`: see `nll`."""
    tx = optax.adam(lr)

    @jax.jit
    def step(b, ad, opt, k):
        toks, mask = rows_fn(k)
        loss, g = jax.value_and_grad(lambda a: nll(graphdef, lora.merge(b, a, s), toks, mask, cap, soft))(ad)
        u, opt = tx.update(g, opt, ad)
        return optax.apply_updates(ad, u), opt, loss

    opt, losses = tx.init(adapters), []
    for k in jax.random.split(key, steps):
        adapters, opt, loss = step(base, adapters, opt, k)
        losses.append(float(loss))
    return adapters, losses


def _templates_hash(folder: str) -> str:
    """Hash of the templates the synthetic rows are built from (actor and distillation prompts; the merge
    prompt's templates do not shape the prior, so editing them keeps the cache)."""
    h = hashlib.sha256()
    for name in prompts.NAMES:
        if name.startswith("merge_"):
            continue
        h.update(name.encode() + b"\0" + prompts.load(name, folder).encode() + b"\0")
    return h.hexdigest()[:16]


def format_prior_id(cfg) -> str:
    """Hash of everything that shapes the format prior (not the run seed or method; not the level pools' seed
    on the built-in grids)."""
    m = lambda mc: {k: getattr(mc, k) for k in ("preset", "weights", "dtype", "truncate_layers")}  # noqa: E731
    # host envs: the rows are states of the training pool's games (`host_prior`), so its seed shapes them too
    host_env = cfg.env.name in adapter_names()
    skip = ("enabled",) if host_env else ("enabled", "host_states")
    host = {"pool_seed": cfg.env.pool_seed, "host_prior": host_prior.HOST_PRIOR_VERSION} if host_env else {}
    # where the TextWorld games are compiled to is not what they are (the same games from the same seeds)
    params = {k: v for k, v in dict(cfg.env.params or {}).items() if k != "cache_dir"}
    key = dict(actor=m(cfg.actor), extractor=m(cfg.extractor), prompts=_templates_hash(cfg.prompts),
               llm_prompt={k: v for k, v in dataclasses.asdict(cfg.llm_prompt).items() if not k.startswith("merge_")},
               lora={k: getattr(cfg.lora, k) for k in LORA_SHAPE_KEYS},
               prior={k: v for k, v in dataclasses.asdict(cfg.format_prior).items() if k not in skip},
               env={"name": cfg.env.name, "params": params, "num_train_tasks": cfg.env.num_train_tasks,
                    "num_eval_tasks": cfg.env.num_eval_tasks, "max_turns": cfg.env.max_turns,
                    "task_ids_in_text": cfg.env.task_ids_in_text, **host},
               entry_len=cfg.bank.entry_len, prompt_len=cfg.extraction.prompt_len,
               max_action_tokens=cfg.rollout.max_action_tokens, version=FORMAT_PRIOR_VERSION)
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def train_format_prior(rt, log=None):
    """-> ({"actor": adapters, "extractor": adapters}, metrics) from fresh adapters on the runtime's base."""
    cfg = rt.cfg
    fp, lc = cfg.format_prior, cfg.lora
    if rt.llm.actor_weights is None or rt.llm.extractor_weights is None:
        raise ValueError("format_prior: needs pretrained actor and extractor weights (actor.weights / extractor.weights)")
    s = lora.scale(lc.rank, lc.alpha)
    targets = lora.parse_targets(lc.targets)
    key = jax.random.key(fp.seed)
    k_ia, k_ie, k_da, k_de = jax.random.split(key, 4)
    out, metrics = {}, {}
    for name, host, mcfg, k_init, k_data, steps, rows in (
            ("actor", rt.llm.actor_weights, rt.actor_config, k_ia, k_da, fp.actor_steps, actor_rows),
            ("extractor", rt.llm.extractor_weights, rt.extractor_config, k_ie, k_de, fp.extractor_steps,
             extractor_rows)):
        base = jax.tree_util.tree_map(jnp.asarray, host)  # one device copy per call; never written
        ad = lora.init(base, k_init, rank=lc.rank, targets=targets)
        # the same parameters under a graphdef that rematerialises each block in the backward pass: the
        # activations of 30 blocks x ~1k-token prompts would not fit a CPU's memory otherwise
        gd = nnx.graphdef(nnx.eval_shape(lambda c=mcfg: tr.create(c.replace(remat=True), jax.random.key(0))))
        ad, losses = fit(gd, base, ad, lambda k, rows=rows: rows(rt, k, fp.batch), k_data, steps, fp.lr, s,
                         reply_cap(rt, name), soft=op_target(rt) if name == "extractor" else None)
        out[name] = ad
        if losses:
            if log:
                log(f"format prior {name}: loss {losses[0]:.3f} -> {losses[-1]:.3f} in {steps} steps")
            metrics[f"{name}_loss_first"], metrics[f"{name}_loss_last"] = losses[0], losses[-1]
    return out, metrics


_MEMO: dict[str, dict] = {}


def adapter_template(rt) -> dict:
    """Fresh adapters of both models (the shapes and dtypes a cache file must have)."""
    lc = rt.cfg.lora
    targets = lora.parse_targets(lc.targets)
    return {n: lora.init(jax.tree_util.tree_map(jnp.asarray, w), jax.random.key(0), rank=lc.rank, targets=targets)
            for n, w in (("actor", rt.llm.actor_weights), ("extractor", rt.llm.extractor_weights))}


def format_prior_adapters(rt, log=None, *, refit: bool = False) -> dict:
    """The cached adapters of `rt.cfg`'s format prior, trained on first use. `refit`: train into the cache
    even if a cached copy exists (`crl-jax pretrain --refit`)."""
    pid = format_prior_id(rt.cfg)
    if pid in _MEMO and not refit:
        return _MEMO[pid]
    path = os.path.join(cache_dir(rt.cfg), f"format-prior-{pid}.npz")
    if refit:
        for p in (path, path[:-4] + ".json"):
            if os.path.exists(p):
                os.remove(p)
    _MEMO[pid] = cached_or_trained(path, adapter_template(rt), lambda say: train_format_prior(rt, log=say),
                                   what="format prior", id_key="format_prior_id", pid=pid, log=log)
    return _MEMO[pid]


def starting_weights(rt, log=None) -> dict:
    """{"actor", "extractor"}: host params base + merged format-prior adapters (every method starts here)."""
    ad = format_prior_adapters(rt, log)
    s = lora.scale(rt.cfg.lora.rank, rt.cfg.lora.alpha)
    merge = jax.jit(lambda b, a: lora.merge(b, a, s))
    return {n: jax.tree_util.tree_map(np.asarray, merge(w, ad[n]))
            for n, w in (("actor", rt.llm.actor_weights), ("extractor", rt.llm.extractor_weights))}
