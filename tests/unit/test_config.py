"""Config: YAML + dotted overrides, typed validation with messages that name the key."""

import dataclasses
import json

import jax
import pytest

from crl_jax.config import (REMOVED_KEYS, Config, ConfigError, drop_removed_keys, from_dict, load, parse_overrides,
                            to_dict)


def test_defaults_are_the_embedded_default():
    cfg = load(None)
    assert cfg == Config()
    assert cfg.method == "crl" and cfg.env.name == "room" and cfg.env.params["dark"] is True


def test_file_and_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("method: grpo\nactor:\n  lr: 0.001\nenv:\n  params: {dark: false, traps: true}\n")
    cfg = load(str(p), ["actor.lr=2e-3", "rollout.groups=2", "env.params.monster=true", "seed=7"])
    assert cfg.method == "grpo" and cfg.actor.lr == 2e-3 and cfg.rollout.groups == 2 and cfg.seed == 7
    assert cfg.env.params == {"dark": False, "traps": True, "monster": True}


def test_parse_overrides_nested():
    assert parse_overrides(["a.b.c=1", "a.d=x"]) == {"a": {"b": {"c": 1}, "d": "x"}}


@pytest.mark.parametrize("override,key", [
    (["actor.lrr=1"], "actor.lrr"),
    (["bogus=1"], "bogus"),
    (["actor.lr=fast"], "actor.lr"),
    (["rollout.groups=1.5"], "rollout.groups"),
    (["method=ppo"], "method"),
    (["loss.group_split=maybe"], "loss.group_split"),
    (["rollout.group_size=3"], "rollout.group_size"),
    (["extraction.buffer_capacity=8", "extraction.batch=8"], "extraction.buffer_capacity"),
    (["actor.lr=-1"], "actor.lr"),
    (["method=offline"], "bank.offline_path"),
    (["extraction.return_samples=-1"], "extraction.return_samples"),
    (["extraction.op_explore=1.0"], "extraction.op_explore"),
    (["extraction.op_explore=0.1", "extractor.preset=smollm2-135m"], "extraction.op_explore"),
    (["extraction.update_unretrieved=skip"], "extraction.update_unretrieved"),
    (["extraction.op_weight=0"], "extraction.op_weight"),
    (["extraction.op_weight=4", "extractor.preset=smollm2-135m"], "extraction.op_weight"),
    (["extraction.op_entropy=-0.1"], "extraction.op_entropy"),
    (["extraction.op_entropy=0.1", "extractor.preset=smollm2-135m"], "extraction.op_entropy"),
    (["extraction.outcome_last=true", "extractor.preset=smollm2-135m"], "extraction.outcome_last"),
    (["extraction.oracle_write_reward=true", "extractor.preset=smollm2-135m"], "extraction.oracle_write_reward"),
    (["extraction.baseline=group"], "extraction.baseline"),
    (["bank.select=ucb"], "bank.select"),
    (["rollout.turn_block=-1"], "rollout.turn_block"),
    (["rollout.turn_block=8", "actor.preset=smollm2-135m"], "rollout.turn_block"),
    (["extractor.scan_unroll=-2"], "extractor.scan_unroll"),
    (["loss.head_chunk=-1"], "loss.head_chunk"),
])
def test_bad_values_name_the_key(override, key):
    with pytest.raises(ConfigError) as e:
        load(None, override)
    assert key in str(e.value)


def test_bad_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load(str(tmp_path / "missing.yaml"))
    p = tmp_path / "bad.yaml"
    p.write_text("method: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load(str(p))
    p.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load(str(p))


def test_override_syntax_error():
    with pytest.raises(ConfigError, match="key=value"):
        load(None, ["actor.lr"])


def test_method_switches():
    assert not Config(method="grpo").uses_bank
    assert Config(method="static_online").edits_bank and not Config(method="static_online").trains_extractor
    assert not Config(method="exp_only").trains_actor and Config(method="exp_only").trains_extractor
    off = load(None, ["method=offline", "bank.offline_path=x.jsonl"])
    assert off.uses_bank and not off.edits_bank


def test_dotted_env_params_override_merges_into_default_params():
    assert load(None, ["env.params.crop=1"]).env.params == {"dark": True, "crop": 1, "legend": False}
    assert load(None, ["env.name=maze", "env.params.dark=true"]).env.params == {"dark": True}  # another env: its own


@pytest.mark.parametrize("key", sorted(REMOVED_KEYS))
def test_removed_keys_are_rejected_in_files_and_overrides_with_the_reason(key, tmp_path):
    section, name = key.split(".")
    with pytest.raises(ConfigError, match=f"^{key}: this key was removed") as e:
        load(None, [f"{key}=1"])
    assert REMOVED_KEYS[key] in str(e.value)
    p = tmp_path / "c.yaml"
    p.write_text(f"{section}:\n  {name}: x\n")
    with pytest.raises(ConfigError, match=f"^{key}: this key was removed"):
        load(str(p))


def test_a_saved_config_with_removed_keys_loads_with_a_warning():
    """A run folder's config.json written before the removal: the keys held the one value their path
    accepted, so dropping them gives the same Config."""
    saved = to_dict(load(None, ["rollout.groups=2"]))
    old = json.loads(json.dumps(saved))
    old["rollout"].update(history="current", action_format="constrained")
    old["extraction"]["format"] = "constrained"
    old["bank"].update(embedder="hashed", top_k=1)
    with pytest.warns(UserWarning, match="run/config.json: ignoring rollout.history"):
        assert drop_removed_keys(old, "run/config.json") == saved
    assert old["rollout"]["history"] == "current"  # the input is not modified
    with pytest.warns(UserWarning):
        assert from_dict(drop_removed_keys(old)) == load(None, ["rollout.groups=2"])
    with pytest.raises(ConfigError, match="unknown config key 'bank.bogus'"):  # other unknown keys still fail
        from_dict(drop_removed_keys({**saved, "bank": {**saved["bank"], "bogus": 1}}))


def test_pack_mlp_is_on_for_every_mesh_unless_set():
    """`actor.pack_mlp` / `extractor.pack_mlp`: packed gate / up by default on every mesh (it all-reduces no more
    bytes than two matmuls, `test_mesh_collectives.py`); null (older configs) is on too; an
    explicit false wins, on either path."""
    from crl_jax.backends.llm import runtime as llm_runtime
    from crl_jax.loop import runtime as loop_runtime

    for overrides, want in (([], (True, True)), (["mesh.data=-1"], (True, True)), (["mesh.fsdp=2"], (True, True)),
                            (["mesh.tensor=-1"], (True, True)), (["actor.pack_mlp=null"], (True, True)),
                            (["mesh.fsdp=2", "actor.pack_mlp=false"], (False, True)),
                            (["extractor.pack_mlp=false"], (True, False))):
        rt = loop_runtime.build(load(None, overrides))
        assert (rt.actor_config.pack_mlp, rt.extractor_config.pack_mlp) == want, overrides
    llm = load(None, ["actor.preset=smollm2-135m", "actor.truncate_layers=2", "actor.pack_mlp=false"])
    assert llm_runtime._load(llm.actor)[0].pack_mlp is False
    assert llm_runtime._load(load(None, ["actor.preset=smollm2-135m", "actor.truncate_layers=2"]).actor)[0].pack_mlp
    with pytest.raises(ConfigError, match="actor.pack_mlp"):
        load(None, ["actor.pack_mlp=3"])


def test_scan_unroll_reaches_the_model_config_on_both_paths():
    """`actor.scan_unroll` / `extractor.scan_unroll` set TransformerConfig.scan_unroll: the tiny path
    (loop.runtime) and the LLM path (backends.llm.runtime, a random-init preset); 0 = every layer."""
    from crl_jax.backends.llm import runtime as llm_runtime
    from crl_jax.loop import runtime as loop_runtime

    cfg = load(None, ["actor.scan_unroll=0", "actor.num_layers=3"])
    assert loop_runtime._model_config(cfg.actor, 32).scan_unroll == 3
    assert loop_runtime._model_config(cfg.extractor, 32).scan_unroll == 1
    llm = load(None, ["actor.preset=smollm2-135m", "actor.scan_unroll=0", "actor.truncate_layers=4",
                      "extractor.preset=smollm2-135m", "extractor.scan_unroll=2"])
    assert llm_runtime._load(llm.actor)[0].scan_unroll == 4
    assert llm_runtime._load(llm.extractor)[0].scan_unroll == 2


def test_head_chunk_sets_both_llm_learners_vocabulary_head():
    """`loss.head_chunk` reaches the LLM path's actor (PPO) and extractor (CISPO) loss options: rows per chunk of the
    fused head; 0 turns the fused head off (the vocabulary-tiled path)."""
    from crl_jax.backends.llm import runtime as llm_runtime

    cases = (([], True, 1024), (["loss.head_chunk=256"], True, 256), (["loss.head_chunk=0"], False, 1024))
    for over, fused, chunk in cases:
        for lc in llm_runtime.loss_configs(load(None, over)):
            assert (lc.fused_head, lc.head_chunk) == (fused, chunk), over


def test_the_packed_weight_is_merged_on_the_cpu_without_a_tensor_axis():
    """`merge_gate_up` (the packed gate / up matmul over [H, 2I]: faster gradients on XLA:CPU) is on only on the CPU
    with `mesh.tensor` 1, where no mesh axis shards the MLP's width (a merged axis would lose that sharding), and
    only when gate / up are packed; both paths' runtimes pass the run's mesh.tensor."""
    from crl_jax.backends.llm import runtime as llm_runtime
    from crl_jax.loop import runtime as loop_runtime

    m = load(None, []).actor
    assert m.forward_options(2, backend="cpu")["merge_gate_up"]
    for kw in (dict(backend="gpu"), dict(backend="tpu"), dict(backend="cpu", tensor=2), dict(backend="cpu", tensor=-1)):
        assert not m.forward_options(2, **kw)["merge_gate_up"], kw
    assert not dataclasses.replace(m, pack_mlp=False).forward_options(2, backend="cpu")["merge_gate_up"]
    cpu = jax.default_backend() == "cpu"
    for overrides, want in (([], cpu), (["mesh.fsdp=-1"], cpu), (["mesh.tensor=-1"], False)):
        rt = loop_runtime.build(load(None, overrides))
        assert rt.actor_config.merge_gate_up == rt.extractor_config.merge_gate_up == want, overrides
    llm = load(None, ["actor.preset=smollm2-135m", "actor.truncate_layers=2", "mesh.tensor=-1"])
    assert not llm_runtime._load(llm.actor, llm.mesh.tensor)[0].merge_gate_up
    assert llm_runtime._load(llm.actor)[0].merge_gate_up == cpu


def test_scan_unroll_auto_unrolls_every_layer_on_a_gpu_only():
    """-1 (the default): every layer on a GPU, where the rolled scan copies every saved activation into [L, ...]
    stacks, a rolled scan on the CPU and TPU; explicit values pass through."""
    m = load(None, []).actor
    assert m.scan_unroll == -1
    assert m.forward_options(30, backend="gpu")["scan_unroll"] == 30
    assert m.forward_options(30, backend="cpu")["scan_unroll"] == 1
    assert m.forward_options(30, backend="tpu")["scan_unroll"] == 1
    assert m.forward_options(30)["scan_unroll"] == (30 if jax.default_backend() == "gpu" else 1)
    for u, want in ((0, 30), (1, 1), (6, 6)):
        assert dataclasses.replace(m, scan_unroll=u).forward_options(30, backend="gpu")["scan_unroll"] == want
