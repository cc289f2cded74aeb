"""The RL math of Complementary RL, as small pure functions (METHOD.md §2-3): advantages (`advantages.py`:
GRPO, split GRPO, repeat weights, extractor advantages), policy losses (`policy.py`: PPO-clip, CISPO) and
the extractor's credit (`credit.py`: per-entry rewards from the episodes each entry guided).

Every function is jit-able, does its math in float32 and returns `loss = -objective`. Shapes:
`G` groups of `K` rollouts, `B` sequences of `T` tokens, `N` extractor samples. Masks select the
tokens that are trained (response tokens); a row with no valid token contributes nothing and never
produces NaN.

The policy losses are built as rlax builds them, from separate small functions, each with its equation:
per-token terms (`log_ratio`, `sequence_log_ratio`, `ppo_clip_token_loss`, `cispo_token_loss`, `k3_kl`),
aggregations to (numerator, denominator) (`seq_mean_token_mean`, `token_mean`) and diagnostics
(`clip_fraction`, `ratio_mean`, `approx_kl`, `mean_entropy`); `ppo_clip_loss` and `cispo_loss` compose them.
`row_coefficients` and `ppo_token_terms` write the PPO numerator as a sum of per-token terms, the form the
learner's fused vocabulary head takes (`train_state.token_loss`).

Split GRPO (paper Eq. 5) with the 1/2 weighting of the guided and free subgroups is expressed with
per-sequence `sample_weight`s: `ppo_clip_loss` is a *weighted mean* over sequences (or tokens), so
`split_group_weights(guided)` (1 / (number of non-empty subgroups x subgroup size)) makes the loss the
mean, over groups and their subgroups, of each subgroup's mean loss; with equal-size subgroups every
weight is equal and plain weights (all ones) give exactly the same loss.
"""

from crl_jax.losses.advantages import (  # noqa: F401
    group_advantages, subgroup_advantages, split_group_weights, repeat_weights, extractor_advantages,
)
from crl_jax.losses.policy import (  # noqa: F401
    log_ratio, sequence_log_ratio, ppo_clip_token_loss, cispo_token_loss, ppo_clipped, cispo_clipped, k3_kl,
    token_entropy, seq_mean_token_mean, token_mean, AGGREGATIONS, masked_mean, clip_fraction, ratio_mean,
    approx_kl, mean_entropy, policy_diagnostics, ppo_clip_loss_parts, ppo_clip_loss, cispo_loss_parts,
    cispo_loss, row_coefficients, ppo_token_terms, ppo_sequence_terms, op_token_weights,
)
