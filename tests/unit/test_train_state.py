"""Train states, the optimizer factory, token log-probs and the jit-compiled co-update on tiny models."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from crl_jax.learner import loss_fns
from crl_jax.learner import train_state as ts
from crl_jax.models import transformer as tfm

CFG = tfm.tiny_config(64, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1)
TX = ts.make_optimizer(1e-2)  # one optimizer object for every state: it is static in the compiled program
FAST = {"xla_backend_optimization_level": 0}  # halves CPU compile time; numerics are unaffected
B, T = 4, 10


@functools.lru_cache(maxsize=1)
def _initial_states():
    return (ts.create_train_state(tfm.create(CFG, jax.random.key(0)), TX),
            ts.create_train_state(tfm.create(CFG, jax.random.key(1)), TX))


def _states():
    """Fresh device copies of the two initial states (each co-update call donates its inputs)."""
    return jax.tree_util.tree_map(lambda x: jnp.array(x, copy=True), _initial_states())


def _host(tree):
    """A numpy copy (the co-update donates its input states)."""
    return jax.tree_util.tree_map(np.array, tree)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, 64, (B, T)), jnp.int32)
    mask = ts.response_mask(jnp.full((B,), 3), jnp.array([10, 8, 6, 10]), T)
    actor, extractor = _states()
    logp_fn = jax.jit(ts.token_logprobs, static_argnums=0)
    a_logp = logp_fn(actor.graphdef, actor.params, tokens, mask)[0]
    e_logp = logp_fn(extractor.graphdef, extractor.params, tokens, mask)[0]
    ab = ts.ActorBatch(tokens, mask, a_logp, jnp.array([1.0, -1.0, 1.0, -1.0]), jnp.ones(B))
    eb = ts.ExtractorBatch(tokens, mask, e_logp, jnp.array([1.0, -0.5, 0.5, -1.0]), jnp.array(True))
    return ab, eb


@pytest.fixture(scope="module")
def program():
    # One compiled program shared by every co-update test; the guard fails on any retrace.
    return ts.make_co_update(loss_fns.actor_ppo_loss(), loss_fns.extractor_cispo_loss(), max_traces=1,
                             compiler_options=FAST)


def test_token_logprobs_matches_log_softmax():
    actor, _ = _states()
    tokens = jnp.array([[5, 7, 9, 11, 2], [1, 2, 3, 4, 5]], jnp.int32)
    mask = jnp.array([[1, 0, 1, 1, 1], [1, 1, 1, 0, 0]], bool)  # column 0 has no prediction: ignored
    logp, ent = jax.jit(ts.token_logprobs, static_argnums=0, static_argnames="with_entropy")(
        actor.graphdef, actor.params, tokens, mask, with_entropy=True)
    logits = np.asarray(jax.jit(tfm.apply, static_argnums=0)(actor.graphdef, actor.params, tokens), np.float64)
    lsm = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    for b in range(2):
        for t in range(5):
            want = lsm[b, t - 1, tokens[b, t]] if (t >= 1 and mask[b, t]) else 0.0
            np.testing.assert_allclose(logp[b, t], want, atol=1e-5)
    np.testing.assert_allclose(ent[0, 2], -(np.exp(lsm[0, 1]) * lsm[0, 1]).sum(), atol=1e-5)
    assert ent[0, 0] == 0 and ent[0, 1] == 0 and ent[1, 4] == 0


def test_make_optimizer_literal():
    p = {"w": jnp.array([0.0, 0.0])}
    g = {"w": jnp.array([3.0, -4.0])}  # global norm 5 -> clipped to [0.6, -0.8]
    # b1 = b2 = 0, eps = 1: the Adam step is -lr * g / (|g| + 1).
    tx = ts.make_optimizer(0.1, b1=0.0, b2=0.0, eps=1.0)
    u, _ = tx.update(g, tx.init(p), p)
    np.testing.assert_allclose(u["w"], [-0.1 * 0.6 / 1.6, 0.1 * 0.8 / 1.8], rtol=1e-6)
    tx = ts.make_optimizer(0.1, b1=0.0, b2=0.0, eps=1.0, grad_clip=None)
    u, _ = tx.update(g, tx.init(p), p)
    np.testing.assert_allclose(u["w"], [-0.1 * 3 / 4, 0.1 * 4 / 5], rtol=1e-6)
    # Decoupled weight decay: -lr * (adam step + wd * param).
    p1 = {"w": jnp.array([1.0, 1.0])}
    tx = ts.make_optimizer(0.1, weight_decay=0.5, b1=0.0, b2=0.0, eps=1.0, grad_clip=None)
    u, _ = tx.update(g, tx.init(p1), p1)
    np.testing.assert_allclose(u["w"], [-0.1 * (0.75 + 0.5), -0.1 * (-0.8 + 0.5)], rtol=1e-6)


def test_train_state_is_a_pytree():
    actor, _ = _states()
    leaves, treedef = jax.tree_util.tree_flatten(actor)
    back = jax.tree_util.tree_unflatten(treedef, leaves)
    assert back.graphdef == actor.graphdef and back.tx is actor.tx
    assert int(actor.step) == 0 and int(actor.nonfinite_count) == 0
    assert all(isinstance(x, jax.Array) for x in leaves)


def test_co_update_learns_both_models(program, data):
    ab, eb = data
    actor, extractor = _states()
    first = None
    for _ in range(50):
        actor, extractor, m = program(actor, extractor, ab, eb)
        first = first or {k: float(v) for k, v in m.items()}
    # PPO starts on-policy at loss -mean(A) = 0 and goes down until the clip binds (-0.2 at best).
    assert abs(first["actor/loss"]) < 1e-5
    assert float(m["actor/loss"]) < -0.15
    # CISPO has no clip on the objective: the extractor keeps raising log-probs of positive-A samples.
    assert float(m["extractor/loss"]) < first["extractor/loss"] - 1.0
    assert int(actor.step) == 50 and int(extractor.step) == 50
    assert int(actor.nonfinite_count) == 0 and int(extractor.nonfinite_count) == 0
    assert float(m["actor/updated"]) == 1.0 and float(m["extractor/ready"]) == 1.0


def test_extractor_not_ready_is_bit_identical(program, data):
    ab, eb = data
    actor, extractor = _states()
    a0, e0 = _host(actor), _host(extractor)
    a_in, e_in = actor, extractor
    actor, extractor, m = program(actor, extractor, ab, eb.replace(ready=jnp.array(False)))
    # Both input states were donated (their buffers now belong to the outputs).
    assert all(x.is_deleted() for x in jax.tree_util.tree_leaves((a_in.params, e_in.params)))
    e1 = _host(extractor)
    for x, y in zip(jax.tree_util.tree_leaves(e0), jax.tree_util.tree_leaves(e1)):
        np.testing.assert_array_equal(x, y)  # params, Adam moments, counters: bit for bit
    assert int(extractor.step) == 0
    assert float(m["extractor/updated"]) == 0.0 and float(m["extractor/ready"]) == 0.0
    assert int(actor.step) == 1  # the actor half still ran
    moved = [not np.array_equal(x, y) for x, y in zip(jax.tree_util.tree_leaves(a0.params),
                                                      jax.tree_util.tree_leaves(_host(actor.params)))]
    assert any(moved)


def test_nan_batch_skips_update_and_counts(program, data):
    ab, eb = data
    actor, extractor = _states()
    a0, e0 = _host(actor.params), _host(extractor.params)
    bad_ab = ab.replace(advantages=ab.advantages.at[1].set(jnp.nan))
    bad_eb = eb.replace(behavior_logp=eb.behavior_logp.at[0, 5].set(jnp.nan))
    actor, extractor, m = program(actor, extractor, bad_ab, bad_eb)
    for before, st in ((a0, actor), (e0, extractor)):
        for x, y in zip(jax.tree_util.tree_leaves(before), jax.tree_util.tree_leaves(_host(st.params))):
            np.testing.assert_array_equal(x, y)
        assert int(st.nonfinite_count) == 1 and int(st.step) == 0
    assert float(m["actor/nonfinite"]) == 1.0 and float(m["extractor/updated"]) == 0.0
    # Only the bad model is skipped: a good actor batch next to a bad extractor batch still trains.
    actor, extractor, m = program(actor, extractor, ab, bad_eb)
    assert int(actor.step) == 1 and int(actor.nonfinite_count) == 1
    assert int(extractor.step) == 0 and int(extractor.nonfinite_count) == 2
    for x in jax.tree_util.tree_leaves(_host(actor.params)):
        assert np.isfinite(x).all()


def test_empty_batch_is_a_no_op(program, data):
    ab, eb = data
    actor, extractor = _states()
    a0 = _host(actor.params)
    actor, extractor, m = program(actor, extractor, ab.replace(loss_mask=jnp.zeros((B, T), bool)), eb)
    for x, y in zip(jax.tree_util.tree_leaves(a0), jax.tree_util.tree_leaves(_host(actor.params))):
        np.testing.assert_array_equal(x, y)
    assert int(actor.step) == 0 and int(actor.nonfinite_count) == 0 and float(m["actor/loss"]) == 0.0


@pytest.mark.slow
def test_microbatch_accumulation_is_exact(data):
    ab, eb = data
    actor, extractor = _states()
    # Rows differ in length and weight, so the micro-batches' denominators differ.
    ab = ab.replace(weight=jnp.array([0.5, 2.0, 1.0, 0.25]), behavior_logp=ab.behavior_logp - 0.05)

    @functools.partial(jax.jit, compiler_options=FAST)
    def both(actor, extractor):
        out = []
        for st, batch, fn in ((actor, ab, loss_fns.actor_ppo_loss()),
                              (extractor, eb, loss_fns.extractor_cispo_loss())):
            n1, d1, g1, _ = ts._grads(st, batch, fn, 1)
            n2, d2, g2, _ = ts._grads(st, batch, fn, 2)
            out.append((n1 / d1, n2 / d2, jax.tree_util.tree_map(lambda x, d=d1: x / d, g1),
                        jax.tree_util.tree_map(lambda x, d=d2: x / d, g2)))
        return out

    for l1, l2, g1, g2 in both(actor, extractor):
        np.testing.assert_allclose(l1, l2, rtol=1e-5)
        for x, y in zip(jax.tree_util.tree_leaves(g1), jax.tree_util.tree_leaves(g2)):
            np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-7)
    with pytest.raises(ValueError, match="divisible"):
        ts._split_microbatches(ab, 3)


def test_apply_updates_target_kl_stops_at_the_first_step_over_it():
    """approx KL per step (measured before it) 0.01, 0.02, 0.5, 0.01 with target 0.1: steps 0 and 1 are
    applied, step 2 and every later one skipped; target 0 applies all four."""

    def loss_fn(graphdef, params, batch):
        first = jax.tree_util.tree_leaves(params)[0]
        return jnp.sum(first.astype(jnp.float32)) * batch["w"], (jnp.float32(1.0), {"approx_kl": batch["kl"]})

    batches = {"w": jnp.ones((4,)), "kl": jnp.array([0.01, 0.02, 0.5, 0.01])}
    actor, _ = _states()
    run = jax.jit(lambda st, b, tk: ts.apply_updates(st, b, loss_fn, 1, 4, tk), static_argnums=2)
    stopped, m = run(actor, batches, 0.1)
    assert int(stopped.step) == 2 and float(m["steps_taken"]) == 2.0
    two, _ = jax.jit(lambda st, b: ts.apply_updates(st, b, loss_fn, 1, 2))(
        _states()[0], jax.tree_util.tree_map(lambda x: x[:2], batches))
    for a, b in zip(jax.tree_util.tree_leaves(stopped.params), jax.tree_util.tree_leaves(two.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # exactly the first two steps
    every, m0 = run(_states()[0], batches, 0.0)
    assert int(every.step) == 4 and "steps_taken" not in m0


@pytest.mark.parametrize("grad_of_zero", ["inf", "nan"])
def test_a_finite_loss_with_a_non_finite_gradient_skips_the_update(grad_of_zero):
    """The guard reads the gradients' global norm (one pass, the metric's): a finite loss whose gradient holds
    one inf or NaN entry is not applied, and counts as non-finite; the same loss with a finite gradient is."""
    state, _ = _states()
    bad = {"inf": jnp.sqrt, "nan": lambda x: jnp.sqrt(x * x)}[grad_of_zero]  # value 0 at 0, gradient inf / NaN

    def loss_fn(f):
        def fn(graphdef, params, batch):
            first = jax.tree_util.tree_leaves(params)[0].reshape(-1)[0]
            return 1.0 + f(first - jax.lax.stop_gradient(first)), (jnp.float32(1.0), {})  # loss 1 at any params
        return fn

    for f, applied in ((bad, False), (lambda x: 0.5 * x, True)):
        new, m = jax.jit(lambda s: ts.apply_update(s, None, loss_fn(f)))(state)
        assert float(m["loss"]) == 1.0
        assert float(m["updated"]) == float(applied) and float(m["nonfinite"]) == float(not applied)
        assert int(new.step) == int(applied) and int(new.nonfinite_count) == int(not applied)
        moved = any(bool(jnp.any(a != b)) for a, b in zip(jax.tree_util.tree_leaves(new.params),
                                                          jax.tree_util.tree_leaves(state.params)))
        assert moved == applied
