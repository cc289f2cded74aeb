"""The Runtime of a config: `build(cfg)`, the one entry for every path, built once on the host and cached.

The compiled loop closes over a `Runtime` (`crl_jax.backends.base`): environments (train and held-out
pools), the tokenizer, renderers, fixed prompt pieces as token arrays, model graph definitions, the
co-update, the embedder, and the path's own pieces (`rt.tiny` or `rt.llm`). Nothing here is traced;
everything the loop carries lives in `LoopState`. LLM configs (`actor.preset != "tiny"`) are built by
`crl_jax.backends.llm.runtime`; the tiny models' Runtime (built-in JAX envs and host adapters) here.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp

from crl_jax.actor.rollout import Segments
from crl_jax.backends.base import (  # noqa: F401  (Runtime, TinyParts, LLMParts, response_masks: re-exported)
    DistillTokens, LLMParts, Runtime, TinyParts, assemble, builtin_envs, normalise, pad_rows, response_masks,
)
from crl_jax.backends.builtin import BUILTIN
from crl_jax.backends.host.env import host_envs, make_host_renderer
from crl_jax.backends.llm import runtime as llm_runtime
from crl_jax.backends.llm.runtime import is_llm_config
from crl_jax.config import Config, ConfigError, to_dict
from crl_jax.envs.actions import action_allowed_mask, action_token_ids, tiny_tokenizer
from crl_jax.envs.adapters import names as adapter_names
from crl_jax.envs.compact import FORMS, compact_vocabulary, grid_shape, make_compact_renderer
from crl_jax.envs.render import make_token_renderer
from crl_jax.extractor.merge_step import MergePieces
from crl_jax.learner import train_state as ts
from crl_jax.learner.loss_fns import actor_turn_loss, extractor_constrained_loss
from crl_jax.models import transformer as tr

OPS = ("<ADD>", "<UPDATE>", "<RETURN>")


def _one(tok, text):
    ids = tok.encode(text)
    return jnp.asarray(ids if ids else [0], jnp.int32), jnp.int32(len(ids))


def is_host(rt) -> bool:
    """Does the Runtime's environment step on the host (an adapter, `crl_jax.backends.host.env`)? Then its rollouts
    cannot run inside one compiled program (`crl_jax.host.driver` drives them)."""
    return bool(getattr(rt.env, "is_host", False))


def _model_config(m, vocab_size, tensor: int = 1) -> tr.TransformerConfig:
    if m.preset != "tiny":
        raise ConfigError(f"preset {m.preset!r}: the built-in loop supports preset=tiny; pretrained presets "
                          "run through crl_jax.backends.llm (see experiments/configs/smollm2_room.yaml)")
    return tr.tiny_config(vocab_size, hidden_size=m.hidden_size, num_layers=m.num_layers, num_heads=m.num_heads,
                          num_kv_heads=m.num_kv_heads, intermediate_size=m.intermediate_size, param_dtype=m.dtype,
                          **m.forward_options(m.num_layers, tensor=tensor))


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
    """The Runtime of a config (any path), cached by everything that shapes the compiled program.

    Seeds, run lengths, methods and ablation switches share one Runtime (and so one compiled program):
    in `rt.cfg` they are normalised (`normalise`: seed 0, steps 0, method crl, ...) — read them from the
    run's own config. The seed enters through the run key, the length as a traced argument, the method as
    the traced `LoopState.flags`."""
    cfg = normalise(cfg)
    k = json.dumps(to_dict(cfg), sort_keys=True)
    if k not in _CACHE:
        with jax.ensure_compile_time_eval():  # concrete arrays even when first built inside a jit trace
            # the LLM builder is looked up at call time: tests swap in small random-init models through it
            _CACHE[k] = llm_runtime._build(cfg) if is_llm_config(cfg) else _build(cfg)
    return _CACHE[k]


def _build(cfg: Config) -> Runtime:
    """The tiny models' Runtime: built-in JAX envs, or a host adapter's pools (`crl_jax.backends.host.env`:
    descriptors and text -> tokens renderers; the games run in `crl_jax.host.driver`)."""
    is_host = cfg.env.name in adapter_names()
    if is_host and cfg.rollout.share_prefix:
        raise ConfigError(f"rollout.share_prefix: env {cfg.env.name!r} steps on the host, one compiled call per "
                          "turn, so there is no episode-long program to keep the encoded task text in; set it false")
    env, eval_env = host_envs(cfg) if is_host else builtin_envs(cfg)
    compact = cfg.rollout.view == "compact"
    T = min(cfg.env.max_turns, env.max_steps)
    if compact and is_host:
        raise ConfigError(f"rollout.view=compact: env.name={cfg.env.name!r} is a host-side environment whose "
                          "observations are text; set rollout.view=text")
    if cfg.pretrain.enabled and is_host:
        raise ConfigError(f"pretrain.enabled: the prior's synthetic observations are built-in grids; env.name="
                          f"{cfg.env.name!r} is a host-side environment: set pretrain.enabled=false")
    forms = cfg.extraction.forms  # config check: compact view only
    extra = OPS + (compact_vocabulary(env.num_tasks, eval_env.num_tasks, T, grid_shape(env), forms) if compact else ())
    tok = tiny_tokenizer(env.action_names, extra=extra)
    if is_host:
        renderer, eval_renderer = make_host_renderer(env, tok), make_host_renderer(eval_env, tok)
    elif compact:
        renderer, eval_renderer = make_compact_renderer(env, tok), make_compact_renderer(eval_env, tok)
    else:
        renderer, eval_renderer = make_token_renderer(env, tok), make_token_renderer(eval_env, tok)
    a_ids = jnp.asarray(action_token_ids(env, tok), jnp.int32)
    op_ids = jnp.asarray([tok.extra_id(o) for o in OPS], jnp.int32)
    text = _COMPACT_TEXT if compact else _TEXT
    turn, turn_len = pad_rows([tok.encode(text["turn"].format(t=t)) for t in range(T)])
    (pre, pre_len), (suf, suf_len), (act, act_len) = (_one(tok, text[k]) for k in ("tip", "tip_end", "act"))
    form_ids = row_ids = col_ids = None
    if forms:  # the entry forms (`crl_jax.extractor.forms`): FACT entries are written in the view's cell tokens
        form_ids = jnp.asarray([tok.extra_id(f) for f in FORMS], jnp.int32)
        row_ids, col_ids = jnp.asarray(renderer.row_ids), jnp.asarray(renderer.col_ids)
    seg = Segments(pre, pre_len, suf, suf_len, turn, turn_len, act, act_len, tip_window=cfg.rollout.tip_window,
                   fact_rows=row_ids)
    tr_rows = [tok.encode(task_text(env, i, "", cfg.env.task_ids_in_text, compact)) for i in range(env.num_tasks)]
    ev_rows = [tok.encode(task_text(eval_env, i, "E", cfg.env.task_ids_in_text, compact))
               for i in range(eval_env.num_tasks)]
    width = max(max(len(r) for r in tr_rows), max(len(r) for r in ev_rows))
    ttok, tlen = pad_rows(tr_rows, width)
    etok, elen = pad_rows(ev_rows, width)
    # the outcome line: row 0 = failure, row 1 = success (one table so compiled code can index it)
    distill = DistillTokens(*(_one(tok, text[k]) for k in ("header", "trajectory", "retrieved", "answer")),
                            outcome=pad_rows([tok.encode(text["failure"]), tok.encode(text["success"])]))
    merge_pieces = MergePieces(*(_one(tok, text["merge_" + k]) for k in MergePieces._fields))
    acfg = _model_config(cfg.actor, tok.vocab_size, cfg.mesh.tensor)
    ecfg = _model_config(cfg.extractor, tok.vocab_size, cfg.mesh.tensor)
    if cfg.extraction.max_new_tokens - 1 > cfg.bank.entry_len:
        raise ConfigError("extraction.max_new_tokens: entries (max_new_tokens - 1 tokens) must fit "
                          f"bank.entry_len={cfg.bank.entry_len}")
    lc, ec = cfg.loss, cfg.extraction
    tiny = TinyParts(seg=seg, action_ids=a_ids, op_ids=op_ids, distill=distill, vocab_size=tok.vocab_size,
                     eos_id=tok.eos_id, min_entry=ec.min_entry, form_ids=form_ids, row_ids=row_ids, col_ids=col_ids)
    first, early, rest, *form = tiny.response_masks()
    pc = cfg.pretrain
    aux = pc.aux_coef if pc.enabled else 0.0
    co_update = ts.make_co_update(
        actor_turn_loss(action_allowed_mask(a_ids, tok.vocab_size), clip_eps=lc.clip_eps,
                        temperature=cfg.actor.temperature, ratio=lc.ratio, aux_coef=aux),
        extractor_constrained_loss(first, rest, early_allowed=early, min_entry=ec.min_entry, eps_low=ec.eps_low,
                                   eps_high=ec.eps_high, temperature=ec.temperature, aux_coef=aux,
                                   op_weight=ec.op_weight, form_allowed=form[0] if form else None,
                                   op_entropy=ec.op_entropy),
        microbatches=lc.microbatches, actor_steps=lc.epochs * lc.minibatches, extractor_steps=ec.epochs,
        actor_target_kl=lc.target_kl, donate=False)
    return assemble(cfg, backend=BUILTIN, tokenizer=tok, env=env, eval_env=eval_env, renderer=renderer,
                    eval_renderer=eval_renderer, train_task_tokens=ttok, train_task_len=tlen, eval_task_tokens=etok,
                    eval_task_len=elen, merge_pieces=merge_pieces, num_turns=T, actor_config=acfg,
                    extractor_config=ecfg, co_update=co_update, tiny=tiny)
