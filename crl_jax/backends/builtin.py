"""The backend of the built-in JAX environments with the tiny models (`crl_jax.backends.base`).

Rollouts are `rollout.play` (one constrained action token per turn, the whole episode inside the compiled
step), distillation writes an operation token and action tokens (`distill`), the actor batch has one row
per played turn, the extractor batch repeats for `extraction.epochs` optimizer steps and carries the
auxiliary prior rows, and the models start from the synthetic-data prior (METHOD.md §6) when
`pretrain.enabled`. Host-side environments (`host.driver`) share every piece but `play`.
"""

from __future__ import annotations

import jax
from flax import nnx

from crl_jax.actor.evaluate import evaluate_pool
from crl_jax.actor.rollout import play
from crl_jax.backends.base import Backend
from crl_jax.extractor.distill import distill
from crl_jax.extractor.merge_step import maybe_merge, merge_prompt_len, merge_response_len
from crl_jax.learner import batches
from crl_jax.learner import pretrain
from crl_jax.models import transformer as tr


def play_episodes(rt, state, p, key):
    return play(state.actor.graphdef, state.actor.params, rt.env, rt.renderer, rt.tiny.seg, rt.tiny.action_ids, key,
                tasks=p.tasks, task_tokens=p.task_tokens, task_len=p.task_len, exp=p.exp, exp_len=p.exp_len,
                has_exp=p.has_exp, num_turns=rt.num_turns, temperature=rt.cfg.actor.temperature,
                turn_marker=rt.cfg.rollout.turn_marker, share_prefix=rt.cfg.rollout.share_prefix,
                prefix_block=rt.cfg.rollout.groups, turn_block=rt.cfg.rollout.turn_block,
                end_cell=rt.cfg.extraction.forms)


def extractor_batch(rt, buffer, step, ready, key):
    return batches.extractor_batch(rt, buffer, step, ready, key, rt.cfg.extraction.epochs)


def init_models(rt, cfg, k_a, k_e):
    actor = tr.create(rt.actor_config, jax.random.fold_in(k_a, cfg.actor.init_seed))
    extractor = tr.create(rt.extractor_config, jax.random.fold_in(k_e, cfg.extractor.init_seed))
    if cfg.pretrain.enabled:  # every method and seed starts from the same prior (METHOD.md §6)
        with jax.ensure_compile_time_eval():  # trained (or loaded) once on the host, never inside a trace
            prior = pretrain.prior_params(rt)
        nnx.update(actor, prior["actor"])
        nnx.update(extractor, prior["extractor"])
    return actor, extractor


def buffer_dims(cfg, merge_pieces):
    # Merge generations share the buffer with distillations: room for both when merges run. Without merges the
    # rows are only as wide as a distillation (tiny default: 48 + 21 tokens instead of 215 + 105; the CRL step
    # got ~1.4x cheaper on CPU).
    if not cfg.extraction.merge:
        return cfg.extraction.prompt_len, cfg.extraction.max_new_tokens
    return (max(cfg.extraction.prompt_len, merge_prompt_len(cfg, merge_pieces)),
            max(cfg.extraction.max_new_tokens, merge_response_len(cfg)))


BUILTIN = Backend(name="builtin", play=play_episodes, distill=distill, actor_batch=batches.actor_batch,
                  extractor_batch=extractor_batch, merge=maybe_merge, evaluate_pool=evaluate_pool,
                  init_models=init_models, buffer_dims=buffer_dims, episode_metrics=lambda rt, ep: {})
