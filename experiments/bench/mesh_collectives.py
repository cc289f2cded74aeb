"""Collectives in a sharded training gradient, packed gate / up against two matmuls (`TransformerConfig.pack_mlp`).

    python experiments/bench/mesh_collectives.py                      # fsdp 4 / tensor 4 / fsdp 2 x tensor 2
    python experiments/bench/mesh_collectives.py --hidden 512 --seq 256 --json OUT

Simulated CPU devices (`--xla_force_host_platform_device_count`): the value and gradient of a 2-layer model's
next-token loss with the parameters placed by `infra.sharding.param_specs` and the batch over (data, fsdp),
compiled, and its all-reduce / all-gather / reduce-scatter / all-to-all / collective-permute ops counted, with the
shapes of the all-reduces one variant has that the other does not. Nothing is run.
"""

from __future__ import annotations

import os

if __name__ == "__main__":
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import argparse  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
from collections import Counter  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from crl_jax.config import MeshConfig  # noqa: E402
from crl_jax.infra import sharding  # noqa: E402
from crl_jax.models import transformer as tr  # noqa: E402

_OPS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


def collectives(mesh_cfg: MeshConfig, pack: bool, hidden: int, seq: int, batch: int) -> tuple[Counter, list[str]]:
    cfg = tr.tiny_config(256, hidden_size=hidden, intermediate_size=2 * hidden, num_layers=2, num_heads=4,
                         num_kv_heads=2, max_position_embeddings=max(seq, 64), pack_mlp=pack)
    mesh = sharding.make_mesh(mesh_cfg)
    gd, params = tr.split(tr.create(cfg, jax.random.key(0)))
    params = jax.device_put(params, jax.tree.map(lambda s: NamedSharding(mesh, s),
                                                 sharding.param_specs(params, mesh, cfg)))
    toks = jax.device_put(jax.random.randint(jax.random.key(1), (batch, seq), 0, 256),
                          NamedSharding(mesh, P(("data", "fsdp"), None)))

    def loss(p, t):
        lg = tr.merge(gd, p)(t).astype(jnp.float32)
        return jnp.mean(jax.nn.logsumexp(lg, -1) - jnp.take_along_axis(lg, t[..., None], -1)[..., 0])

    txt = jax.jit(jax.value_and_grad(loss)).lower(params, toks).compile().as_text()
    found = re.findall(r"= (\S+) (" + "|".join(_OPS) + r")(?:-start)?\(", txt)
    return Counter(op for _, op in found), sorted(shape.split("{")[0] for shape, op in found if op == "all-reduce")


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser()
    p.add_argument("--meshes", default="1x4x1,1x1x4,1x2x2", help="data x fsdp x tensor, comma separated")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    rows = []
    for spec in a.meshes.split(","):
        d, f, t = (int(x) for x in spec.split("x"))
        mc = MeshConfig(data=d, fsdp=f, tensor=t)
        (cp, arp), (cu, aru) = (collectives(mc, pack, a.hidden, a.seq, a.batch) for pack in (True, False))
        extra = list((Counter(arp) - Counter(aru)).elements())
        rows.append(dict(mesh=spec, packed=dict(cp), two_matmuls=dict(cu), packed_extra_all_reduces=extra))
        print(json.dumps(rows[-1]), flush=True)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return rows


if __name__ == "__main__":
    main()
