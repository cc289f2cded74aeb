"""Mesh sharding of the whole loop state (8 simulated CPU devices): rules, placement, and equality of
sharded chunks with the one-device program."""

import jax
import numpy as np
import pytest
from _sharding_common import assert_metrics_close, micro_cfg, on_mesh, one_device
from jax.sharding import PartitionSpec as P

from crl_jax import loop
from crl_jax.config import MeshConfig
from crl_jax.infra import sharding
from crl_jax.loop.runtime import build


def test_make_mesh_auto_and_errors():
    assert jax.device_count() == 8
    m = sharding.make_mesh(MeshConfig(data=-1, fsdp=2, tensor=2))
    assert m.axis_names == ("data", "fsdp", "tensor") and dict(m.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert sharding.mesh_shape(MeshConfig(data=1, fsdp=-1, tensor=1), 8) == (1, 8, 1)
    with pytest.raises(ValueError, match="must equal"):
        sharding.make_mesh(MeshConfig(data=3, fsdp=1, tensor=1))
    with pytest.raises(ValueError, match="do not divide"):
        sharding.make_mesh(MeshConfig(data=-1, fsdp=3, tensor=1))
    with pytest.raises(ValueError, match="at most one"):
        sharding.make_mesh(MeshConfig(data=-1, fsdp=-1, tensor=1))
    a, e = sharding.split_devices(MeshConfig(extractor_devices=0.25))
    assert len(a) == 6 and len(e) == 2 and not set(a) & set(e)


def _abstract_state():
    cfg = micro_cfg()
    rt = build(cfg)
    return rt, jax.eval_shape(lambda k: loop.init_state(rt, k, cfg), jax.random.key(0))


def test_param_specs_follow_the_rules():
    """micro model: H=32, I=64, Nq=4 (D=8), Nkv=2, L=1; the vocabulary shards over tensor when it divides."""
    rt, s = _abstract_state()
    mesh = sharding.make_mesh(MeshConfig(data=1, fsdp=4, tensor=2))
    sp = sharding.param_specs(s.actor.params, mesh, rt.actor_config)
    V = rt.actor_config.vocab_size
    assert sp["embed"].get_value() == (P("tensor", "fsdp") if V % 2 == 0 else P(None, "fsdp"))
    assert sp["wq"].get_value() == P(None, "fsdp", "tensor")
    assert sp["wk"].get_value() == P(None, "fsdp", "tensor")  # 2 kv heads over tensor=2
    assert sp["wo"].get_value() == P(None, "tensor", "fsdp")
    assert sp["w_down"].get_value() == P(None, "tensor", "fsdp")
    assert sp["attn_norm"].get_value() == P() or sp["attn_norm"].get_value() == P(None, None)
    # optimizer moments follow their parameter; the step count is replicated
    msp = sharding.param_specs(s.actor.opt_state, mesh, rt.actor_config)
    assert msp[1][0].mu["w_up"].get_value() == P(None, "fsdp", "tensor") and msp[1][0].count == P()
    # sizes that do not divide replicate: kv heads 2 over tensor=4 (16 divides, heads do not)
    mesh4 = sharding.make_mesh(MeshConfig(data=1, fsdp=2, tensor=4))
    sp4 = sharding.param_specs(s.actor.params, mesh4, rt.actor_config)
    assert sp4["embed"].get_value() == (P("tensor", "fsdp") if V % 4 == 0 else P(None, "fsdp"))
    assert sp4["wk"].get_value() == P(None, "fsdp", None)
    assert sp4["wq"].get_value() == P(None, "fsdp", "tensor")  # 4 heads over 4
    assert sharding.batch_spec(2, sharding.make_mesh(MeshConfig(data=2, fsdp=2, tensor=2)), 8) == P(("data", "fsdp"), None)


def _spec(x):
    return x.sharding.spec


@pytest.mark.slow
@pytest.mark.parametrize("shape", [(8, 1, 1), (2, 2, 2), (1, 4, 2)])
def test_sharded_chunk_equals_one_device(shape):
    bank = "entries" if shape == (8, 1, 1) else "replicated"
    _, state, m = on_mesh(*shape, bank=bank)
    assert_metrics_close(m, one_device()[1])
    base = one_device()[0]
    np.testing.assert_allclose(np.asarray(state.actor.params["wq"][...]), np.asarray(base.actor.params["wq"][...]),
                               rtol=1e-4, atol=1e-6)
    a, mu = state.actor.params, state.actor.opt_state[1][0].mu
    assert len(a["wq"][...].sharding.device_set) == 8
    if shape == (8, 1, 1):
        assert _spec(a["wq"][...]) == P(None, None, None)  # data parallel only: params replicated
        assert _spec(state.bank.keys) == P(("data",), None) or _spec(state.bank.keys) == P("data", None)
    if shape == (2, 2, 2):
        assert _spec(a["wq"][...]) == P(None, "fsdp", "tensor")
        assert _spec(state.extractor.params["w_gate"][...]) == P(None, "fsdp", "tensor")
        assert _spec(mu["wv"][...]) == P(None, "fsdp", "tensor")
        assert _spec(state.bank.keys) == P()
    if shape == (1, 4, 2):
        assert _spec(a["embed"][...]) == P("tensor", "fsdp")
        assert _spec(a["w_down"][...]) == P(None, "tensor", "fsdp")
        assert a["w_down"][...].addressable_shards[0].data.shape == (1, 32, 8)  # I=64/2, H=32/4
    assert _spec(state.buffer.prompt) == P() and _spec(state.key) == P()


@pytest.mark.slow
def test_disjoint_submeshes_agree_with_shared_mesh():
    """extractor_devices=0.5: actor resident on devices 0-3, extractor on 4-7; same compiled program and
    results as the shared (2, 2, 2) mesh."""
    placement, state, m = on_mesh(2, 2, 2, extractor_devices=0.5)
    _, shared, m_shared = on_mesh(2, 2, 2)
    assert placement.disjoint
    devs = jax.devices()
    a_set = state.actor.params["wq"][...].sharding.device_set
    e_set = state.extractor.params["wq"][...].sharding.device_set
    assert a_set == set(devs[:4]) and e_set == set(devs[4:]) and not a_set & e_set
    assert state.extractor.opt_state[1][0].nu["embed"][...].sharding.device_set == set(devs[4:])
    assert_metrics_close(m, m_shared)
    np.testing.assert_allclose(np.asarray(state.extractor.params["w_up"][...]),
                               np.asarray(shared.extractor.params["w_up"][...]), rtol=1e-5, atol=1e-7)
    # one program for both placements (the sub-mesh run reuses the shared mesh's compiled chunk)
    assert sharding._jitted(build(micro_cfg()), 2, placement) is sharding._jitted(build(micro_cfg()), 2, on_mesh(2, 2, 2)[0])
