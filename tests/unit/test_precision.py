"""Mixed precision: bfloat16 weights with float32 masters learn at the paper's lr 1e-6; without masters they do not."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from crl_jax.config import Config, ConfigError, ModelConfig
from crl_jax.config_checks import validate
from crl_jax.learner import precision
from crl_jax.learner import train_state as ts
from crl_jax.models import transformer as tfm

CFG = tfm.tiny_config(64, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
                      param_dtype="bfloat16")
LR = 1e-6


def _matrices(params):
    """The 0.02-scale weight matrices (norm scales start at 1, biases at 0: not the probe's population)."""
    return [x for x in jax.tree_util.tree_leaves(params) if x.ndim >= 2]


def _linear_loss(coef):
    """loss = sum(coef * w) over every weight: the gradient is `coef`, known exactly."""
    def loss(graphdef, params, batch):
        leaves = jax.tree_util.tree_leaves(params)
        return sum(jnp.sum(c * w.astype(jnp.float32)) for c, w in zip(coef, leaves)), (jnp.float32(1.0), {})
    return loss


@pytest.fixture(scope="module")
def model_and_coef():
    model = tfm.create(CFG, jax.random.key(0))
    leaves = jax.tree_util.tree_leaves(jax.tree_util.tree_map(lambda x: x, tfm.nnx.split(model, tfm.nnx.Param)[1]))
    keys = jax.random.split(jax.random.key(1), len(leaves))
    coef = [jax.random.normal(k, x.shape, jnp.float32) for k, x in zip(keys, leaves)]
    return model, coef


def _run(model, coef, master_dtype, steps, tx):
    state = ts.create_train_state(model, tx, master_dtype)
    step = jax.jit(lambda s: ts.apply_update(s, None, _linear_loss(coef))[0])
    first = None
    for i in range(steps):
        state = step(state)
        first = state if i == 0 else first
    return state, first


def test_masters_move_by_exactly_adams_first_step(model_and_coef):
    model, coef = model_and_coef
    state0 = ts.create_train_state(model, ts.make_optimizer(LR, grad_clip=None), jnp.float32)
    assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves((state0.master, state0.opt_state))
               if jnp.issubdtype(x.dtype, jnp.floating))
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree_util.tree_leaves(state0.params))
    _, s1 = _run(model, coef, jnp.float32, 1, ts.make_optimizer(LR, grad_clip=None))
    for m0, m1, c, p1 in zip(jax.tree_util.tree_leaves(state0.master), jax.tree_util.tree_leaves(s1.master), coef,
                             jax.tree_util.tree_leaves(s1.params)):
        # Adam's first step: m_hat = g, v_hat = g^2, so the update is -lr * g / (|g| + eps)
        expected = np.asarray(m0) - np.float32(LR) * np.asarray(c) / (np.abs(np.asarray(c)) + np.float32(1e-8))
        np.testing.assert_allclose(np.asarray(m1), expected, rtol=0, atol=2 * np.spacing(np.float32(np.abs(m0).max())))
        np.testing.assert_array_equal(np.asarray(p1), np.asarray(m1.astype(jnp.bfloat16)))  # params = masters rounded



def _unchanged_fraction(before, after) -> float:
    """Fraction of the elements of two same-shaped lists of arrays that are bit-equal."""
    eq = sum(int(jnp.sum(a == b)) for a, b in zip(before, after))
    return eq / sum(x.size for x in before)


def test_masters_learn_where_bfloat16_updates_round_away(model_and_coef):
    """The probe: 10 steps at lr 1e-6 with the project's optimizer (global-norm clip) on 0.02-scale weights."""
    model, coef = model_and_coef
    tx = ts.make_optimizer(LR)
    before = _matrices(tfm.nnx.split(model, tfm.nnx.Param)[1])
    mixed, _ = _run(model, coef, jnp.float32, 10, tx)
    pure, _ = _run(model, coef, None, 10, tx)
    assert pure.master is None
    moved_masters = 1 - _unchanged_fraction([x.astype(jnp.float32) for x in before], _matrices(mixed.master))
    unchanged_pure = _unchanged_fraction(before, _matrices(pure.params))
    assert moved_masters >= 0.99, moved_masters
    assert unchanged_pure >= 0.95, unchanged_pure  # the old behaviour: the bfloat16 update rounds away
    # the masters moved ~10 * lr each; the bfloat16 copy follows once a master crosses a rounding boundary
    delta = np.concatenate([np.ravel(np.asarray(b, np.float32) - np.asarray(a)) for a, b in
                            zip(_matrices(mixed.master), before)])
    assert 0.5 * 10 * LR < np.median(np.abs(delta)) <= 10 * LR * 1.01


def test_master_rule_and_config_checks():
    assert precision.make_master({"w": jnp.ones(3, jnp.float32)}, jnp.float32) is None  # float32 / LoRA adapters
    assert precision.make_master({"w": jnp.ones(3, jnp.bfloat16)}, None) is None
    assert precision.master_dtype(ModelConfig(dtype="bfloat16")) == jnp.float32  # the default: masters
    assert precision.master_dtype(ModelConfig(dtype="bfloat16", param_dtype="bfloat16")) is None
    assert precision.master_dtype(ModelConfig()) is None
    with pytest.raises(ConfigError, match="actor.param_dtype"):
        validate(Config(actor=ModelConfig(param_dtype="bfloat16")))
    with pytest.raises(ConfigError, match="extractor.param_dtype"):
        validate(Config(extractor=ModelConfig(param_dtype="float16")))


def test_dry_run_tokenizer_lines(tmp_path):
    """The dry run's tokenizer report: files present, vocabulary sizes, one shared tokenizer or not."""
    import dataclasses

    from tokenizers import Tokenizer, models

    from crl_jax.infra.dry_run_report import tokenizer_lines

    def folder(name, vocab):
        d = tmp_path / name
        d.mkdir()
        Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token=vocab[0])).save(str(d / "tokenizer.json"))
        return str(d)

    a, b, c = folder("a", ["<unk>", "x", "y"]), folder("b", ["<unk>", "x", "y"]), folder("c", ["<unk>", "x"])
    cfg = lambda wa, we: Config(actor=ModelConfig(preset="qwen2.5-0.5b", weights=wa),  # noqa: E731
                                extractor=ModelConfig(preset="qwen2.5-0.5b", weights=we))
    lines = tokenizer_lines(cfg(a, b))
    assert "present, vocab 3" in lines[0] and lines[-1] == "  shared: one tokenizer (identical files)"
    assert "vocab 3 vs 2" in tokenizer_lines(cfg(a, c))[-1]
    assert tokenizer_lines(cfg(a, str(tmp_path / "none")))[1].endswith("tokenizer.json: missing")
    assert "no weights named" in tokenizer_lines(dataclasses.replace(cfg(a, b), actor=ModelConfig(preset="qwen2.5-0.5b")))[0]
