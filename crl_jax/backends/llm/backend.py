"""The backend of the LLM path (`crl_jax.backends.base`): pretrained instruct models, chat prompts, free-text
answers, JSON operations.

Rollouts are whole chat conversations (`llm.rollout.play`), distillation and merge parse JSON operations
(`llm.distill`, `llm.merge`), the actor batch has one row per conversation with its reply tokens trained,
the extractor batch is one CISPO batch (no epochs, no auxiliary rows: the LLM's skills come from
pretraining and the optional format prior). With `lora.train` (the presets' default) both models train
LoRA adapters over one frozen base (`crl_jax.backends.llm.adapters`: shared when they are one checkpoint;
the format prior's adapters are the starting point); with `lora.train=false` they fine-tune full weights
starting from the loaded checkpoint (separate copies for actor and extractor), or from base + the format
prior's merged adapters when `format_prior.enabled`. Compiled chunks donate their input state.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from crl_jax.backends.base import Backend
from crl_jax.backends.llm import adapters
from crl_jax.backends.llm.distill import distill
from crl_jax.backends.llm.evaluate import evaluate_pool
from crl_jax.backends.llm.format_prior import format_prior_adapters, starting_weights
from crl_jax.backends.llm.merge import maybe_merge
from crl_jax.backends.llm.merge import prompt_len as merge_prompt_len
from crl_jax.backends.llm.rollout import LLMEpisodes, play
from crl_jax.learner import batches
from crl_jax.learner import train_state as ts
from crl_jax.models import transformer as tr


def play_episodes(rt, state, p, key):
    return play(rt, adapters.actor_params(state), key, env=rt.env, renderer=rt.renderer, tasks=p.tasks,
                task_tokens=p.task_tokens, task_len=p.task_len, exp=p.exp, exp_len=p.exp_len, has_exp=p.has_exp,
                temperature=rt.cfg.actor.temperature, prefix_block=rt.cfg.rollout.groups)


def actor_batch(rt, ep: LLMEpisodes, guided, split, key=None):
    """Whole conversations [N, P] as rows, reply tokens trained, split-GRPO advantages and weights."""
    G, K = guided.shape
    adv, w = batches.episode_advantages(rt, ep.reward.reshape(G, K), guided, split)
    batch = ts.ActorBatch(tokens=ep.tokens, loss_mask=ep.loss_mask, behavior_logp=ep.logp,
                          advantages=adv.reshape(-1), weight=w.reshape(-1),
                          trained_width=rt.num_turns * rt.cfg.rollout.max_action_tokens)  # every reply's tokens
    return batch, {"adv_abs_mean": jnp.abs(adv).mean()}


def extractor_batch(rt, buffer, step, ready, key=None):
    return batches.extractor_batch(rt, buffer, step, ready)


def _model(graphdef, cfg, host, key):
    if host is None:
        return tr.create(cfg, key)
    return nnx.merge(graphdef, jax.tree_util.tree_map(lambda x: jnp.array(x, copy=True), host))


def init_models(rt, cfg, k_a, k_e):
    """(actor, extractor): nnx models (full fine-tune) or (graphdef, lora.LoRAParams) pairs (`lora.train`)."""
    if adapters.enabled(cfg):
        prior = format_prior_adapters(rt) if cfg.format_prior.enabled else None
        return adapters.init_lora_models(rt, cfg, k_a, k_e, prior)
    a_w, e_w = rt.llm.actor_weights, rt.llm.extractor_weights
    if cfg.format_prior.enabled:  # METHOD.md §6: the same format prior for every method (cached)
        w = starting_weights(rt)
        a_w, e_w = w["actor"], w["extractor"]
    actor = _model(rt.actor_graphdef, rt.actor_config, a_w, jax.random.fold_in(k_a, cfg.actor.init_seed))
    extractor = _model(rt.extractor_graphdef, rt.extractor_config, e_w,
                       jax.random.fold_in(k_e, cfg.extractor.init_seed))
    return actor, extractor


def buffer_dims(cfg, merge_pieces):
    # merge samples share the buffer with distillations: prompts as wide as the longer of the two (when merges run)
    if not cfg.extraction.merge:
        return cfg.extraction.prompt_len, cfg.extraction.max_new_tokens
    return max(cfg.extraction.prompt_len, merge_prompt_len(cfg, merge_pieces)), cfg.extraction.max_new_tokens


def episode_metrics(rt, ep: LLMEpisodes) -> dict:
    played = jnp.maximum(ep.turns.sum(), 1).astype(jnp.float32)
    return {"invalid_action_frac": ep.invalid.sum().astype(jnp.float32) / played,
            "prompt_fill": ep.length.max().astype(jnp.float32) / ep.tokens.shape[1]}


LLM = Backend(name="llm", play=play_episodes, distill=distill, actor_batch=actor_batch,
              extractor_batch=extractor_batch, merge=maybe_merge, evaluate_pool=evaluate_pool,
              init_models=init_models, buffer_dims=buffer_dims, episode_metrics=episode_metrics, donate=True)
