"""One process of the 2-process localhost test (tests/slow/test_multihost.py); not a test module.

argv: coordinator process_id num_processes out_dir. Runs the micro config's sharded chunk on a (2, 2, 2)
mesh over all processes' devices, saves and restores an Orbax checkpoint collectively, and (process 0)
writes the metrics and a parameter to out_dir/result.npz.
"""

import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax

jax.config.update("jax_default_matmul_precision", "highest")

from crl_jax.config import DistributedConfig, MeshConfig
from crl_jax.infra import distributed


def main():
    if os.environ.get("CRL_WORKER_TRACE"):  # debugging aid: dump stacks if a worker hangs
        import faulthandler

        faulthandler.dump_traceback_later(float(os.environ["CRL_WORKER_TRACE"]), exit=True)
    coord, pid, n, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    assert distributed.initialize(DistributedConfig(coordinator=coord, num_processes=n, process_id=pid))
    assert jax.process_count() == n and jax.device_count() == 4 * n and jax.local_device_count() == 4

    import jax.numpy as jnp
    import numpy as np

    from crl_jax.infra import sharding
    from crl_jax.infra.checkpoint import Checkpointer
    from crl_jax.loop.runtime import build

    sys.path.insert(0, os.path.dirname(__file__))
    from _sharding_common import STEPS, micro_cfg

    import dataclasses

    mesh = MeshConfig(data=2, fsdp=2, tensor=2)
    cfg = dataclasses.replace(micro_cfg(), mesh=mesh)
    rt = build(cfg)
    from crl_jax import loop

    abstract = jax.eval_shape(lambda k: loop.init_state(rt, k, cfg), jax.random.key(cfg.seed))
    placement = sharding.state_shardings(abstract, mesh,
                                         actor_cfg=rt.actor_config, extractor_cfg=rt.extractor_config)
    state = sharding.init_sharded(rt, jax.random.key(cfg.seed), cfg, placement)
    assert not state.actor.params["wq"][...].is_fully_addressable  # spans both processes
    state, m = sharding.sharded_chunk(rt, STEPS, placement)(state, jnp.int32(STEPS))
    metrics = distributed.fetch(m)

    ck = Checkpointer(os.path.join(out, "run"), keep=1)  # collective: every process saves and restores
    ck.save(STEPS, state)
    restored, step = ck.restore(state)
    ck.close()
    assert step == STEPS
    wq, wq_r = distributed.fetch((state.actor.params["wq"][...], restored.actor.params["wq"][...]))
    np.testing.assert_array_equal(wq, wq_r)
    assert restored.actor.params["wq"][...].sharding == state.actor.params["wq"][...].sharding
    if distributed.is_main():
        np.savez(os.path.join(out, "result.npz"), wq=wq, **{k.replace("/", "__"): v for k, v in metrics.items()})
    print(f"process {pid}: ok", flush=True)


if __name__ == "__main__":
    main()
