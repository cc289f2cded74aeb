"""The backend protocol: what differs between the paths that run the one iteration of `crl_jax.loop`.

`crl_jax.loop` holds METHOD.md §2 once (tasks and retrieval, credit, distillation, pruning, the co-update,
the merge, the metrics, the evaluation schedule, the state). A `Backend` supplies the pieces whose form
depends on the models and the environment:

| piece | built-in envs, tiny models (`backends.builtin`) | LLMs (`backends.llm.backend`) |
|---|---|---|
| `play` | `rollout.play`: one constrained action token per turn | `llm.rollout.play`: chat turns, free-text answers |
| `distill` | `distill.distill`: op token + action tokens | `llm.distill.distill`: JSON operations |
| `actor_batch` | one row per played turn (`batches.actor_batch`) | one row per conversation |
| `extractor_batch` | CISPO batch + epochs + auxiliary prior rows | CISPO batch |
| `merge` | `merge_step.maybe_merge` | `llm.merge.maybe_merge` (JSON answers) |
| `evaluate_pool` | `evaluate.evaluate_pool` | `llm.evaluate.evaluate_pool` |
| `init_models` | random init + the synthetic-data prior | pretrained weights (+ format prior) |

Host-side environments (`backends.host.driver`) use the built-in backend's pieces for everything but the rollouts,
which their driver plays on the host between jitted turns.

Every function takes the Runtime `rt` first; a Runtime carries its backend as `rt.backend`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Backend:
    name: str
    # (rt, state, prepared, key) -> episodes (an Episodes-like NamedTuple with success, reward, turns [N])
    play: Callable
    # (rt, bank, buffer, extractor params, key, step, *, task_tokens, task_len, episodes, keys, exp, exp_len,
    #  has_exp, slots, mask) -> distill.DistillOut
    distill: Callable
    # (rt, episodes, guided [G, K], split (traced bool), key) -> (actor batch, metrics)
    actor_batch: Callable
    # (rt, buffer, step, ready, key) -> (buffer, extractor batch)
    extractor_batch: Callable
    # (rt, bank, buffer, extractor params, key, step, enabled) -> (bank, buffer, entries merged)
    merge: Callable
    # (rt, state, *, heldout) -> (success with experience [], without [])
    evaluate_pool: Callable
    # (rt, cfg, actor key, extractor key) -> (actor nnx model, extractor nnx model)
    init_models: Callable
    # (rt, cfg) -> (prompt width, response width) of the extractor's sample buffer
    buffer_dims: Callable
    # (rt, episodes) -> extra per-step metrics of this path
    episode_metrics: Callable
    # compiled chunks donate the input state (two LLMs with optimizer states do not fit twice in memory)
    donate: bool = False
