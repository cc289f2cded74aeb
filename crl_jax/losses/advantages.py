"""Advantages for Complementary RL (METHOD.md §2-3): GRPO over a group, split GRPO over the guided and free
subgroups (paper Eq. 5) and the weights that make the PPO loss the mean of the subgroups' losses; the extractor
samples' repeat weights and advantages. Pure, jit-able, float32. Shapes: `G` groups of `K` rollouts, `N`
extractor samples. Re-exported by `crl_jax.losses`.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

_F32 = jnp.float32


def _safe_div(num, den):
    """num / den, and 0 where den == 0 (an empty mask or an empty subgroup never gives NaN)."""
    return jnp.where(den > 0, num / jnp.where(den > 0, den, 1.0), 0.0)


# ----------------------------------------------------------------------------------------------
# Advantages


def _constant(r, member):
    """[..., 1] bool: the members' values along the last axis are all equal (max == min; False when none)."""
    hi = jnp.max(jnp.where(member, r, -jnp.inf), axis=-1, keepdims=True)
    lo = jnp.min(jnp.where(member, r, jnp.inf), axis=-1, keepdims=True)
    return hi == lo


def _normalise(r, member, normalize: str, eps: float):
    """(r - mean_S) [/ (std_S + eps)] over the members S (bool, same shape) along the last axis. An exactly
    constant S gives exactly 0: its float32 mean can miss the common value by an ulp (0.11 or 7.3 three times),
    and the division by std + eps would blow that ulp up to ~0.3."""
    m = member.astype(_F32)
    n = m.sum(-1, keepdims=True)
    mean = _safe_div((r * m).sum(-1, keepdims=True), n)
    centred = jnp.where(_constant(r, member), 0.0, r - mean)
    if normalize == "mean":
        return centred
    if normalize != "mean_std":
        raise ValueError(f"normalize must be 'mean_std' or 'mean', got {normalize!r}")
    std = jnp.sqrt(_safe_div((centred**2 * m).sum(-1, keepdims=True), n))  # population std
    return centred / (std + eps)


def group_advantages(rewards: jax.Array, *, normalize: str = "mean_std", eps: float = 1e-6) -> jax.Array:
    """Plain GRPO advantages over each whole group.

    A[g, k] = (r[g, k] - mean_k r[g]) / (std_k r[g] + eps)   ("mean_std", population std)
    A[g, k] =  r[g, k] - mean_k r[g]                          ("mean")

    rewards [G, K] -> [G, K] float32. A constant group (or a group of one) gives 0.
    """
    chex.assert_rank(rewards, 2)
    r = rewards.astype(_F32)
    return _normalise(r, jnp.ones(r.shape, bool), normalize, eps)


def subgroup_advantages(rewards: jax.Array, guided: jax.Array, *, normalize: str = "mean_std",
                        eps: float = 1e-6) -> jax.Array:
    """Split-GRPO advantages (paper Eq. 5): guided and free members of each group normalised apart.

    For S = {k : guided[g, k] == guided[g, j]} (the subgroup of member j):
    A[g, j] = (r[g, j] - mean_S r[g]) / (std_S r[g] + eps)   or   r[g, j] - mean_S r[g].

    rewards [G, K], guided [G, K] bool -> [G, K] float32. All-guided (or all-free) equals
    `group_advantages`; a single-member or constant subgroup gives 0.
    """
    chex.assert_rank([rewards, guided], 2)
    chex.assert_equal_shape([rewards, guided])
    r = rewards.astype(_F32)
    g = guided.astype(bool)
    a_guided = _normalise(r, g, normalize, eps)
    a_free = _normalise(r, ~g, normalize, eps)
    return jnp.where(g, a_guided, a_free)


def split_group_weights(guided: jax.Array) -> jax.Array:
    """Per-sequence weights that make the weighted PPO loss the mean of the subgroups' losses.

    w[g, k] = 1 / (n_subgroups(g) * |S(g, k)|), n_subgroups(g) in {1, 2} = number of non-empty
    subgroups of group g. Each group sums to 1 and each of its non-empty subgroups to 1/n_subgroups,
    i.e. the paper's 1/2 weighting. guided [G, K] bool -> [G, K] float32 (flatten to [B] for the batch).
    """
    chex.assert_rank(guided, 2)
    g = guided.astype(bool)
    n_g = g.sum(-1, keepdims=True).astype(_F32)
    n_f = (~g).sum(-1, keepdims=True).astype(_F32)
    n_sub = (n_g > 0).astype(_F32) + (n_f > 0).astype(_F32)
    size = jnp.where(g, n_g, n_f)
    return 1.0 / (n_sub * size)


# ----------------------------------------------------------------------------------------------
# Extractor sample weighting


def repeat_weights(times_trained: jax.Array, last_trained_step: jax.Array, step, *, cooldown: int = 1,
                   power: float = 0.5) -> jax.Array:
    """Down-weighting of extractor samples that were already trained on (METHOD.md step 7).

    w_i = 0                           if last_i >= 0 and step - last_i <= cooldown
    w_i = (1 + times_trained_i)^-power otherwise
    With the default cooldown 1 a sample trained at this step or the previous one weighs 0; cooldown 0: this
    step only. A never-trained sample has last_trained_step = -1 and is never in cooldown.
    times_trained, last_trained_step [N] -> [N] float32.

    Deviates from the first design's `step - last < cooldown`: the loop pops the buffer once per step, so no sample is
    trained twice in one step and with cooldown 1 that formula never fires, whereas METHOD.md step 7 ("w = 0 if
    the sample was trained within the last delta steps", delta = 1) means the previous step counts.
    """
    chex.assert_rank([times_trained, last_trained_step], 1)
    chex.assert_equal_shape([times_trained, last_trained_step])
    last = last_trained_step.astype(jnp.int32)
    cool = (last >= 0) & (jnp.asarray(step, jnp.int32) - last <= cooldown)
    return jnp.where(cool, 0.0, (1.0 + times_trained.astype(_F32)) ** (-power))


BASELINES = ("batch_mean", "none", "outcome_mean")  # = the values of `extraction.baseline`


def extractor_advantages(rewards: jax.Array, valid: jax.Array, weights: jax.Array,
                         baseline: str = "batch_mean", groups: jax.Array | None = None) -> jax.Array:
    """A_i = (r_i - mean_{j valid} r_j) * w_i, and 0 where not valid. [N], [N] bool, [N] -> [N] float32.

    `baseline="none"`: A_i = r_i * w_i. The batch mean is one baseline for samples of different prompts: with
    no-write decisions in the batch (`extraction.return_samples`) it compares a RETURN on a failed episode with
    the batch's successful writes instead of with writing that episode, so it can teach writing failures. Rewards
    already relative to not writing (`relative_to_free`, whose RETURN value is 0) need no baseline.

    `baseline="outcome_mean"`: A_i = (r_i - mean_{j valid, groups_j = groups_i} r_j) * w_i, one mean per group
    ([N] int; the learner groups samples by their episode's outcome). Without any baseline, rewards that are
    positive on average push every write up, failed episodes' too (the op token is one decision read from
    both outcomes); a mean per outcome removes that common push and keeps each decision against the others made
    on episodes of its outcome, writes and no-writes alike."""
    chex.assert_rank([rewards, valid, weights], 1)
    chex.assert_equal_shape([rewards, valid, weights])
    r = rewards.astype(_F32)
    v = valid.astype(bool)
    if baseline not in BASELINES:
        raise ValueError(f"extractor baseline must be one of {BASELINES}, got {baseline!r}")
    if baseline == "outcome_mean":
        if groups is None:
            raise ValueError("extractor baseline 'outcome_mean' needs the samples' groups")
        same = (groups[:, None] == groups[None, :]) & v[None, :]  # [N, N]: valid samples of i's group
        mean = _safe_div(jnp.where(same, r[None, :], 0.0).sum(1), same.sum(1).astype(_F32))
    else:
        mean = _safe_div(jnp.where(v, r, 0.0).sum(), v.sum().astype(_F32)) if baseline == "batch_mean" else 0.0
    return jnp.where(v, (r - mean) * weights.astype(_F32), 0.0)
