"""Static parts of a run, built once on the host from a `Config`.

The compiled loop closes over a `Runtime`: environments (train and held-out pools), the tokenizer, the
token renderer, fixed prompt pieces as token arrays, action/op token tables, model graph definitions and
the embedder. Nothing here is traced; everything the loop carries lives in `LoopState`.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from crl_jax import envs
from crl_jax.actor.rollout import Segments
from crl_jax.backends.base import Backend
from crl_jax.backends.builtin import BUILTIN
from crl_jax.config import Config, ConfigError, DistributedConfig, MeshConfig, to_dict
from crl_jax.envs.actions import action_allowed_mask, action_token_ids, tiny_tokenizer
from crl_jax.envs.compact import compact_vocabulary, grid_shape, make_compact_renderer
from crl_jax.envs.render import make_token_renderer
from crl_jax.learner import train_state as ts
from crl_jax.learner.loss_fns import actor_turn_loss, extractor_constrained_loss
from crl_jax.models import transformer as tr
from crl_jax.models.embed import HashedNgramEmbedder

OPS = ("<ADD>", "<UPDATE>", "<RETURN>")


def _pad_rows(rows: list[list[int]], width: int | None = None, pad: int = 0):
    width = width or max(1, max(len(r) for r in rows))
    out = np.full((len(rows), width), pad, np.int32)
    for i, r in enumerate(rows):
        if len(r) > width:
            raise ValueError(f"token row of length {len(r)} exceeds width {width}")
        out[i, : len(r)] = r
    return jnp.asarray(out), jnp.asarray([len(r) for r in rows], jnp.int32)


def _one(tok, text):
    ids = tok.encode(text)
    return jnp.asarray(ids if ids else [0], jnp.int32), jnp.int32(len(ids))


@dataclass(frozen=True, eq=False)  # hashed by identity: the compiled-chunk cache key
class Runtime:
    cfg: Config
    tokenizer: Any
    env: Any  # training pool
    eval_env: Any  # held-out pool
    renderer: Any
    eval_renderer: Any
    seg: Segments
    action_ids: jax.Array  # [A] token of each action
    op_ids: jax.Array  # [3] tokens of <ADD>, <UPDATE>, <RETURN>
    train_task_tokens: jax.Array  # [num_train_tasks, Lt]
    train_task_len: jax.Array
    eval_task_tokens: jax.Array  # [num_eval_tasks, Lt]
    eval_task_len: jax.Array
    distill: dict  # token pieces of the distillation prompt: header, success, failure
    merge_pieces: dict  # token pieces of the merge prompt: header, sep, context, entries, suffix
    actor_graphdef: Any
    extractor_graphdef: Any
    actor_config: tr.TransformerConfig
    extractor_config: tr.TransformerConfig
    embedder: Any
    num_turns: int
    co_update: Any  # the (actor, extractor) update of train_state.make_co_update
    actor_tx: Any  # optax transformations, built once: they are static parts of the train states' treedef
    extractor_tx: Any
    backend: Backend  # the path's pieces of the one iteration (`crl_jax.backends.builtin.BUILTIN`)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def response_masks(self) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Extractor responses (distillation and merge): first token an operation, then
        `extraction.min_entry` entry tokens (actions only), then actions, operations (each starts / ends an
        entry) or EOS -> (first [V], early [V], rest [V]) bool."""
        return response_masks(self.vocab_size, self.op_ids, self.action_ids, self.tokenizer.eos_id)

    def response_allowed(self, num_tokens: int) -> jax.Array:
        """[num_tokens, V] per-step mask for the sampler."""
        first, early, rest = self.response_masks()
        off = jnp.arange(num_tokens)[:, None]
        m = self.cfg.extraction.min_entry
        return jnp.where(off == 0, first[None], jnp.where(off <= m, early[None], rest[None]))


def is_host(rt) -> bool:
    """Does the Runtime's environment step on the host (an adapter, `crl_jax.backends.host.env`)? Then its rollouts
    cannot run inside one compiled program (`crl_jax.backends.host.driver` drives them)."""
    return bool(getattr(rt.env, "is_host", False))


def response_masks(vocab_size, op_ids, action_ids, eos_id):
    """(first [V], early [V], rest [V]) bool masks of extractor responses (see `Runtime.response_masks`)."""
    first = jnp.zeros((vocab_size,), bool).at[op_ids].set(True)
    early = jnp.zeros((vocab_size,), bool).at[action_ids].set(True)
    return first, early, first.at[action_ids].set(True).at[eos_id].set(True)


def _model_config(m, vocab_size) -> tr.TransformerConfig:
    if m.preset != "tiny":
        raise ConfigError(f"preset {m.preset!r}: the built-in loop supports preset=tiny; pretrained presets "
                          "run through crl_jax.backends.llm (see experiments/configs/smollm2_room.yaml)")
    return tr.tiny_config(vocab_size, hidden_size=m.hidden_size, num_layers=m.num_layers, num_heads=m.num_heads,
                          num_kv_heads=m.num_kv_heads, intermediate_size=m.intermediate_size, param_dtype=m.dtype)


def task_text(env, index: int, pool: str, with_id: bool, compact: bool = False) -> str:
    """The task segment of level `index` of a pool ("" train, "E" held-out): text, or one level token."""
    if compact:
        return f"<{pool or 'L'}{index}>"
    base = env.task_text
    return f"Level {pool}{index}: {base}\n" if with_id else f"{base}\n"


# The fixed prompt pieces of the two views ("compact" uses the atomic marker tokens of envs.compact).
_TEXT = dict(turn="t={t}\n", tip="Tip: ", tip_end="\n", act="Action: ", header="Distil a lesson. ",
             trajectory="Moves: ", retrieved="\nOld tip: ", answer="\nOp: ", failure="\nOutcome: failure",
             success="\nOutcome: success", merge_header="Merge these tips into fewer, better ones.\n",
             merge_sep="\n- ", merge_context="Merged so far:", merge_entries="\nTips:", merge_suffix="\nMerged: ")
_COMPACT_TEXT = dict(turn="<t{t}>", tip="<TIP>", tip_end="", act="<ACT>", header="<DISTIL>", trajectory="<MOVES>",
                     retrieved="<OLD>", answer="<OP>", failure="<FAIL>", success="<SUCC>", merge_header="<MERGE>",
                     merge_sep="<SEP>", merge_context="<CTX>", merge_entries="<TIPS>", merge_suffix="<MERGED>")


_CACHE: dict[str, Runtime] = {}


def build(cfg: Config) -> Runtime:
    """The Runtime of a config, cached by everything that shapes the compiled program.

    Seeds, run lengths, methods and ablation switches share one Runtime (and so one compiled program):
    in `rt.cfg` they are normalised (seed 0, steps 0, method crl, ...) — read them from the run's own
    config. The seed enters through the run key, the length as a traced argument, the method as the
    traced `LoopState.flags`."""
    # Host-only fields and the method switches (traced `MethodFlags` in the state) do not shape the program.
    cfg = dataclasses.replace(cfg, seed=0, steps=0, checkpoint_every=1, keep_checkpoints=1, method="crl",
                              loss=dataclasses.replace(cfg.loss, group_split=True, advantage="split"),
                              extraction=dataclasses.replace(cfg.extraction, merge=True),
                              bank=dataclasses.replace(cfg.bank, offline_path=""),
                              distributed=DistributedConfig(), mesh=MeshConfig())  # placement: sharding.py
    k = json.dumps(to_dict(cfg), sort_keys=True)
    if k not in _CACHE:
        with jax.ensure_compile_time_eval():  # concrete arrays even when first built inside a jit trace
            _CACHE[k] = _build(cfg)
    return _CACHE[k]


def _build(cfg: Config) -> Runtime:
    # --- host adapters (crl_jax/backends/host/env.py): descriptors with is_host=True and text -> tokens renderers;
    # the games themselves run in crl_jax/backends/host/driver.py ---
    from crl_jax.envs.adapters import names as adapter_names

    is_host = cfg.env.name in adapter_names()
    if is_host:
        from crl_jax.backends.host.env import host_envs

        env, eval_env = host_envs(cfg)
    else:
        try:
            env = envs.make(cfg.env.name, pool="train", num_tasks=cfg.env.num_train_tasks,
                            pool_seed=cfg.env.pool_seed, **cfg.env.params)
            eval_env = envs.make(cfg.env.name, pool="eval", num_tasks=cfg.env.num_eval_tasks,
                                 pool_seed=cfg.env.pool_seed, **cfg.env.params)
        except (TypeError, KeyError, ValueError) as e:
            raise ConfigError(f"env: cannot make {cfg.env.name!r} with params {cfg.env.params}: {e}") from None
    compact = cfg.rollout.view == "compact"
    T = min(cfg.env.max_turns, env.max_steps)
    if compact and is_host:
        raise ConfigError(f"rollout.view=compact: env.name={cfg.env.name!r} is a host-side environment whose "
                          "observations are text; set rollout.view=text")
    if cfg.pretrain.enabled and is_host:
        raise ConfigError(f"pretrain.enabled: the prior's synthetic observations are built-in grids; env.name="
                          f"{cfg.env.name!r} is a host-side environment: set pretrain.enabled=false")
    extra = OPS + (compact_vocabulary(env.num_tasks, eval_env.num_tasks, T, grid_shape(env)) if compact else ())
    tok = tiny_tokenizer(env.action_names, extra=extra)
    if is_host:
        from crl_jax.backends.host.env import make_host_renderer

        renderer, eval_renderer = make_host_renderer(env, tok), make_host_renderer(eval_env, tok)
    elif compact:
        renderer, eval_renderer = make_compact_renderer(env, tok), make_compact_renderer(eval_env, tok)
    else:
        renderer = make_token_renderer(env, tok)
        eval_renderer = make_token_renderer(eval_env, tok)
    # --- end host adapters ---
    a_ids = jnp.asarray(action_token_ids(env, tok), jnp.int32)
    op_ids = jnp.asarray([tok.extra_id(o) for o in OPS], jnp.int32)
    text = _COMPACT_TEXT if compact else _TEXT
    turn, turn_len = _pad_rows([tok.encode(text["turn"].format(t=t)) for t in range(T)])
    (pre, pre_len), (suf, suf_len), (act, act_len) = (_one(tok, text[k]) for k in ("tip", "tip_end", "act"))
    seg = Segments(pre, pre_len, suf, suf_len, turn, turn_len, act, act_len, tip_window=cfg.rollout.tip_window)
    tr_rows = [tok.encode(task_text(env, i, "", cfg.env.task_ids_in_text, compact)) for i in range(env.num_tasks)]
    ev_rows = [tok.encode(task_text(eval_env, i, "E", cfg.env.task_ids_in_text, compact))
               for i in range(eval_env.num_tasks)]
    width = max(max(len(r) for r in tr_rows), max(len(r) for r in ev_rows))
    ttok, tlen = _pad_rows(tr_rows, width)
    etok, elen = _pad_rows(ev_rows, width)
    distill = {k: _one(tok, text[k]) for k in ("header", "trajectory", "retrieved", "answer")}
    # Outcome line, row 0 = failure, row 1 = success (one table so compiled code can index it).
    distill["outcome"] = _pad_rows([tok.encode(text["failure"]), tok.encode(text["success"])])
    merge_pieces = {k: _one(tok, text["merge_" + k]) for k in ("header", "sep", "context", "entries", "suffix")}
    acfg = _model_config(cfg.actor, tok.vocab_size)
    ecfg = _model_config(cfg.extractor, tok.vocab_size)
    agd = nnx.graphdef(nnx.eval_shape(lambda: tr.create(acfg, jax.random.key(0))))
    egd = nnx.graphdef(nnx.eval_shape(lambda: tr.create(ecfg, jax.random.key(0))))
    embedder = HashedNgramEmbedder(dim=cfg.bank.key_dim)
    if cfg.extraction.max_new_tokens - 1 > cfg.bank.entry_len:
        raise ConfigError("extraction.max_new_tokens: entries (max_new_tokens - 1 tokens) must fit "
                          f"bank.entry_len={cfg.bank.entry_len}")
    lc, ec = cfg.loss, cfg.extraction
    V = tok.vocab_size
    first, early, rest = response_masks(V, op_ids, a_ids, tok.eos_id)
    pc = cfg.pretrain
    aux = pc.aux_coef if pc.enabled else 0.0
    co_update = ts.make_co_update(
        actor_turn_loss(action_allowed_mask(a_ids, V), clip_eps=lc.clip_eps, temperature=cfg.actor.temperature,
                        ratio=lc.ratio, aux_coef=aux),
        extractor_constrained_loss(first, rest, early_allowed=early, min_entry=ec.min_entry, eps_low=ec.eps_low,
                                   eps_high=ec.eps_high, temperature=ec.temperature, aux_coef=aux),
        microbatches=lc.microbatches, actor_steps=lc.epochs * lc.minibatches, extractor_steps=ec.epochs,
        actor_target_kl=lc.target_kl, donate=False)
    tx_a = ts.make_optimizer(lr=cfg.actor.lr, weight_decay=cfg.actor.weight_decay, grad_clip=cfg.actor.grad_clip)
    tx_e = ts.make_optimizer(lr=cfg.extractor.lr, weight_decay=cfg.extractor.weight_decay,
                             grad_clip=cfg.extractor.grad_clip)
    return Runtime(cfg=cfg, tokenizer=tok, env=env, eval_env=eval_env, renderer=renderer,
                   eval_renderer=eval_renderer, seg=seg, action_ids=a_ids, op_ids=op_ids,
                   train_task_tokens=ttok, train_task_len=tlen, eval_task_tokens=etok, eval_task_len=elen,
                   distill=distill, merge_pieces=merge_pieces, actor_graphdef=agd, extractor_graphdef=egd,
                   actor_config=acfg, extractor_config=ecfg, embedder=embedder, num_turns=T,
                   co_update=co_update, actor_tx=tx_a, extractor_tx=tx_e, backend=BUILTIN)
