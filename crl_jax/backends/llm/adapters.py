"""RL through LoRA adapters on the LLM path (`lora.train=true`, the default of the LLM presets).

The actor and the extractor train only low-rank adapters (`crl_jax.models.lora`: rank, alpha and targets
from `lora.*`) over frozen base weights; `lora.train=false` fine-tunes the full weights instead (the
train states then hold the models' whole parameter trees, as before).

- **One base when the two models are one checkpoint.** When actor and extractor load the same weights
  (same model config and bit-identical parameters: SmolLM2 as both), the loop state holds the base ONCE,
  in the extractor's `LoRAParams.base`; the actor's `LoRAParams.base` is None and every user of the actor
  (rollouts, evaluation, the co-update: `learner.train_state.shared_base`) borrows the extractor's. The
  extractor holds it because the loop hands the extractor only its own params (distillation, merge), while
  the actor's users see the whole state. Different checkpoints (Qwen2.5-7B actor + Qwen3-4B extractor)
  each hold their own base.
- **The format prior's adapters are the adapters' starting point** (not merged into the base): merging
  would give the actor and the extractor different bases, so they could no longer share one. The effective
  starting weights base + scale * A @ B equal the merged starting weights of `lora.train=false` (the
  format prior's `starting_weights`), so both modes start every method from the same model. Without a
  format prior the adapters are fresh (`b = 0`): the effective weights are the base exactly.
- The optimizer state covers the adapters only; the base is never updated, so it stays bit-identical.
- The effective weights are computed at each use (once per rollout, distillation, merge and loss call, not
  per decoded token): a transient merged copy during the call, not a second copy in the state.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from crl_jax.learner.train_state import shared_base
from crl_jax.models import lora
from crl_jax.models import transformer as tr


def enabled(cfg) -> bool:
    return bool(cfg.lora.train)


def same_checkpoint(rt) -> bool:
    """Are actor and extractor one checkpoint: the same model config and bit-identical loaded weights."""
    a, e = rt.llm.actor_weights, rt.llm.extractor_weights
    if a is None or e is None or rt.actor_config != rt.extractor_config:
        return False
    if a is e:
        return True
    la, le = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(e)
    return (jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(e)
            and all(x.shape == y.shape and x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(la, le)))


def _base(graphdef, mcfg, host, key):
    """Frozen base params (a fresh device copy of the host weights, or a random init without weights)."""
    if host is None:
        return tr.split(tr.create(mcfg, key))[1]
    return jax.tree_util.tree_map(lambda x: jnp.array(x, copy=True), host)


def init_lora_models(rt, cfg, k_a, k_e, prior=None):
    """((actor graphdef, LoRAParams), (extractor graphdef, LoRAParams)) for `ts.create_train_state`.
    `prior`: the format prior's adapters {"actor", "extractor"} (their starting point), or None (fresh)."""
    lc = cfg.lora
    s, targets = lora.scale(lc.rank, lc.alpha), lora.parse_targets(lc.targets)
    e_base = _base(rt.extractor_graphdef, rt.extractor_config, rt.llm.extractor_weights,
                   jax.random.fold_in(k_e, cfg.extractor.init_seed))
    shared = same_checkpoint(rt)
    a_base = None if shared else _base(rt.actor_graphdef, rt.actor_config, rt.llm.actor_weights,
                                       jax.random.fold_in(k_a, cfg.actor.init_seed))

    def adapters(name, base, key):
        if prior is not None:
            return jax.tree_util.tree_map(lambda x: jnp.array(x, jnp.float32, copy=True), prior[name])
        return lora.init(base, key, rank=lc.rank, targets=targets)

    a_ad = adapters("actor", e_base if shared else a_base, jax.random.fold_in(k_a, 1 << 20))
    e_ad = adapters("extractor", e_base, jax.random.fold_in(k_e, 1 << 20))
    return ((rt.actor_graphdef, lora.LoRAParams(adapters=a_ad, base=a_base, scale=s)),
            (rt.extractor_graphdef, lora.LoRAParams(adapters=e_ad, base=e_base, scale=s)))


def actor_params(state):
    """The actor's effective parameter tree (a LoRA actor borrows a shared base from the extractor)."""
    return lora.effective(state.actor.params, shared_base(state.actor.params, state.extractor.params))


def extractor_params(params):
    """The extractor's effective parameter tree from its own params (it always holds its base)."""
    return lora.effective(params)
