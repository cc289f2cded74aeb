"""Collectives in a sharded training gradient, packed gate / up against two matmuls (`TransformerConfig.pack_mlp`).

    python experiments/bench/mesh_collectives.py                      # fsdp 4 / tensor 4 / fsdp 2 x tensor 2
    python experiments/bench/mesh_collectives.py --hidden 512 --seq 256 --json OUT

Simulated CPU devices (`--xla_force_host_platform_device_count`): the value and gradient of a 2-layer model's
next-token loss with the parameters placed by `infra.sharding.param_specs` and the batch over (data, fsdp),
compiled, and its all-reduce / all-gather / reduce-scatter / all-to-all / collective-permute ops counted with the
buffers and bytes they move (XLA combines collectives into one op over a tuple of buffers), with the shapes of
the buffers one variant all-reduces that the other does not. Each program also runs once, and the two variants'
losses and gradients on the same mesh are compared (packing must not change them).

An earlier version of this script counted only collectives over a single buffer, so a combined all-reduce of two
buffers went uncounted; the packed variant, whose gate / up gradient is one buffer, looked like it all-reduced
more, and `ModelConfig.pack_mlp` was off on parameter-sharding meshes because of it.
"""

from __future__ import annotations

import os

if __name__ == "__main__":
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import argparse  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
from collections import Counter  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from crl_jax.config import MeshConfig, ModelConfig  # noqa: E402
from crl_jax.infra import sharding  # noqa: E402
from crl_jax.models import transformer as tr  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_aot import shape_bytes, shape_list  # noqa: E402  (this script's neighbour: HLO shapes and their bytes)

_OPS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


def collectives(mesh_cfg: MeshConfig, pack: bool, hidden: int, seq: int, batch: int):
    """-> (`collective_ops` of the compiled gradient program, (loss, gradients) it computes, on the host). Packed, the
    weight is merged into [H, 2I] where a run on the CPU merges it (`ModelConfig.forward_options`: no tensor axis)."""
    cfg = tr.tiny_config(256, hidden_size=hidden, intermediate_size=2 * hidden, num_layers=2, num_heads=4,
                         num_kv_heads=2, max_position_embeddings=max(seq, 64), pack_mlp=pack,
                         merge_gate_up=pack and cpu_merges(mesh_cfg))
    mesh = sharding.make_mesh(mesh_cfg)
    gd, params = tr.split(tr.create(cfg, jax.random.key(0)))
    params = jax.device_put(params, jax.tree.map(lambda s: NamedSharding(mesh, s),
                                                 sharding.param_specs(params, mesh, cfg)))
    toks = jax.device_put(jax.random.randint(jax.random.key(1), (batch, seq), 0, 256),
                          NamedSharding(mesh, P(("data", "fsdp"), None)))

    def loss(p, t):
        lg = tr.merge(gd, p)(t).astype(jnp.float32)
        return jnp.mean(jax.nn.logsumexp(lg, -1) - jnp.take_along_axis(lg, t[..., None], -1)[..., 0])

    comp = jax.jit(jax.value_and_grad(loss)).lower(params, toks).compile()
    return collective_ops(comp.as_text()), jax.device_get(comp(params, toks))


def cpu_merges(mesh_cfg: MeshConfig) -> bool:
    """Whether a run on the CPU on this mesh views the packed gate / up weight as one [H, 2I] matrix."""
    return ModelConfig().forward_options(2, backend="cpu", tensor=mesh_cfg.tensor)["merge_gate_up"]


def collective_ops(hlo: str) -> list[tuple[str, list[str]]]:
    """(kind, result shapes) of every collective in compiled HLO text. XLA's combiners merge collectives into one op
    over a tuple of buffers (`(f32[4,256], f32[4,256])`), so an op count alone says little: count the buffers and
    their bytes. An async pair counts once, by its -start, whose result tuple some collectives (all-gather) print
    with their operands in it: their bytes are an upper bound. All-reduces, the ones compared here, print their
    results only."""
    ops = []
    for line in hlo.splitlines():
        m = re.match(r"\s*(?:ROOT )?%[\w.\-]+ = (.+?) (" + "|".join(_OPS) + r")(-start)?\(", line)
        if m:
            ops.append((m.group(2), shape_list(m.group(1))))
    return ops


def totals(ops) -> dict:
    """{kind: {"ops", "buffers", "bytes"}} of `collective_ops`' list."""
    out = {}
    for kind, shapes in ops:
        t = out.setdefault(kind, dict(ops=0, buffers=0, bytes=0))
        t["ops"] += 1
        t["buffers"] += len(shapes)
        t["bytes"] += sum(shape_bytes(s) for s in shapes)
    return out


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
        (packed, out_p), (two, out_t) = (collectives(mc, pack, a.hidden, a.seq, a.batch) for pack in (True, False))
        bufs = [Counter(s for kind, shapes in ops if kind == "all-reduce" for s in shapes) for ops in (packed, two)]
        grads = zip(jax.tree.leaves(out_p[1]), jax.tree.leaves(out_t[1]))
        rows.append(dict(mesh=spec, merged=cpu_merges(mc), packed=totals(packed), two_matmuls=totals(two),
                         loss_diff=abs(float(out_p[0]) - float(out_t[0])),
                         grad_max_rel_diff=max(float(np.abs(g - h).max() / max(np.abs(h).max(), 1e-30))
                                               for g, h in grads),
                         all_reduced_only_packed=sorted((bufs[0] - bufs[1]).elements()),
                         all_reduced_only_two_matmuls=sorted((bufs[1] - bufs[0]).elements())))
        print(json.dumps(rows[-1]), flush=True)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return rows


if __name__ == "__main__":
    main()
