"""Parameter + optimizer memory of the LLM path's loop state, full fine-tuning vs RL through LoRA adapters
(`lora.train`), for SmolLM2-135M as actor and extractor (issue #17 item 3). Nothing is trained or allocated
on the device: the dry run (`crl_jax.backends.llm.dry_run`, shapes from the preset) and `jax.eval_shape` of
the real `init_state` (the GGUF's weights loaded on the host; format prior off: its adapters have the
same shapes as fresh ones).

    python experiments/llm_lora_memory.py [--config experiments/configs/smollm2_room.yaml] [key=value ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

import jax
import numpy as np

from crl_jax import loop
from crl_jax.backends.llm.dry_run import dry_run
from crl_jax.config import load
from crl_jax.loop.runtime import build

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def nbytes(tree) -> int:
    size = lambda x: 8 if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else np.dtype(x.dtype).itemsize  # noqa: E731
    return int(sum(np.prod(x.shape) * size(x) for x in jax.tree_util.tree_leaves(tree)))


def state_bytes(rt, cfg) -> dict:
    st = jax.eval_shape(lambda k: loop.init_state(rt, k, cfg), jax.random.key(0))
    return {"params": nbytes((st.actor.params, st.extractor.params)),
            "opt_state": nbytes((st.actor.opt_state, st.extractor.opt_state)),
            "models": nbytes((st.actor, st.extractor)), "loop_state": nbytes(st)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=os.path.join(ROOT, "experiments", "configs", "smollm2_room.yaml"))
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args(argv)
    cfg = load(a.config, a.overrides + ["format_prior.enabled=false"])
    d = dry_run(cfg)
    out = {"dry_run": {"state_bytes": d["state_bytes"],
                       **{k: {f: d[k][f] for f in ("num_params", "param_bytes", "opt_bytes", "adapter_params",
                                                   "adapter_bytes", "adapter_opt_bytes")}
                          for k in ("actor", "extractor")}}}
    rt = build(cfg)
    for mode in (False, True):
        c = dataclasses.replace(cfg, lora=dataclasses.replace(cfg.lora, train=mode))
        out["eval_shape_" + ("lora" if mode else "full")] = state_bytes(rt, c)
    print(json.dumps(out, indent=1))
    f, l_ = out["eval_shape_full"]["models"], out["eval_shape_lora"]["models"]
    print(f"params + optimizer state of both models: full {f / 2**20:.1f} MiB, LoRA {l_ / 2**20:.1f} MiB "
          f"({f / l_:.2f}x less)")
    return out


if __name__ == "__main__":
    main()
