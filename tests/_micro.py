"""Micro configs shared by test modules in different folders (tests/integration/test_loop.py,
tests/slow/test_sweep.py, tests/_sharding_common.py; tests/slow/test_host_loop.py,
tests/integration/test_run_engines.py). Not a test module."""

from crl_jax.config import load

# The compiled loop's micro config (the embedded default env).
MICRO = ["rollout.groups=2", "rollout.group_size=4", "env.max_turns=3", "env.num_train_tasks=4",
         "env.num_eval_tasks=4", "env.params.crop=0", "extraction.batch=4", "extraction.buffer_capacity=16",
         "bank.capacity=16", "eval.tasks=2", "eval.every=2", "extraction.merge_every=2", "extraction.merge=true", "loss.turn_rows=8",
         "actor.hidden_size=32", "actor.num_layers=1", "actor.intermediate_size=64",
         "extractor.hidden_size=32", "extractor.num_layers=1", "extractor.intermediate_size=64",
         "extraction.max_new_tokens=6", "bank.entry_len=8", "extraction.prompt_len=120", "checkpoint_every=2",
         "pretrain.actor_steps=20", "pretrain.extractor_steps=20", "pretrain.batch=8"]


def micro(*extra):
    return load(None, MICRO + list(extra))


# The host-side loop's micro config (real MiniHack through its adapter).
HOST_MICRO = ["env.name=minihack-room", "env.params.variant=ultimate", "env.params.max_obs_tokens=200",
              "rollout.groups=2", "rollout.group_size=2", "env.max_turns=3", "env.num_train_tasks=4",
              "env.num_eval_tasks=4", "extraction.batch=4", "extraction.buffer_capacity=16", "bank.capacity=16",
              "eval.tasks=3", "eval.every=2", "extraction.merge_every=2", "extraction.merge=true", "loss.turn_rows=8",
              "actor.hidden_size=32", "actor.num_layers=1", "actor.intermediate_size=64",
              "extractor.hidden_size=32", "extractor.num_layers=1", "extractor.intermediate_size=64",
              "extraction.max_new_tokens=6", "bank.entry_len=8", "extraction.prompt_len=200",
              "rollout.view=text", "rollout.tip_window=0", "pretrain.enabled=false"]
