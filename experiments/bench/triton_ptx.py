"""What the fused decode kernels compile to, without a GPU: registers, spills and shared memory per kernel.

    python experiments/bench/triton_ptx.py [--preset smollm2-135m] [--fused-set 'NUM_WARPS=8;UNROLL=0'] \
        [--triton-python /work/venvs/triton/bin/python] [--json OUT]

`models/experimental/fused_decode.py` lowers its kernels to Triton IR in JAX (any backend: the lowering for CUDA runs on a
CPU); XLA compiles that IR to GPU code only on a GPU. This script lowers one bf16 decode step of the preset's
shape (2 layers) for CUDA with the kernels' `DEBUG` printing on, takes each kernel's Triton module from the
printout, and compiles it for sm_90a (H100 / H200) with the `triton` package in a separate Python (its own
venv: `python -m venv V && V/bin/pip install triton`; not a dependency), then runs its bundled `ptxas -v`.
The Triton there is not the one inside jaxlib, so this is a proxy for what XLA would build: a kernel that
spills here will spill there, and a kernel that fails to compile here deserves a look before a GPU lease.
One row per kernel and `--fused-set` setting (the syntax of sampler.py's flag).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import os
import re
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sampler import set_fused_tiles  # noqa: E402

from crl_jax.models.experimental import fused_decode as fd  # noqa: E402
from crl_jax.models.experimental import fused_sample  # noqa: E402
from crl_jax.models.gpu_target import abstract_gpu  # noqa: E402
from crl_jax.models import transformer as tr  # noqa: E402
from crl_jax.models.presets import preset_config  # noqa: E402

COMPILE = r'''
import glob, json, os, re, subprocess, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import compile as tcompile
d, nw, ns = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
ptxas = next(p for p in (os.path.join(bindir, "ptxas-blackwell"), os.path.join(bindir, "ptxas")) if os.path.exists(p))
rows = []
for path in sorted(glob.glob(os.path.join(d, "*.ttir"))):
    name = os.path.basename(path)[:-5]
    row = dict(kernel=name, triton=triton.__version__)
    try:
        k = tcompile(path, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=nw, num_stages=ns))
        ptx = k.asm["ptx"]
        open(path[:-5] + ".ptx", "w").write(ptx)
        out = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", path[:-5] + ".ptx", "-o", os.devnull],
                             capture_output=True, text=True).stderr
        num = lambda pat: int(m.group(1)) if (m := re.search(pat, out)) else None
        row.update(ok=True, registers=num(r"Used (\d+) registers"), spill_bytes=num(r"(\d+) bytes spill stores"),
                   shared_bytes=k.metadata.shared, global_loads=ptx.count("ld.global"))
    except Exception as e:
        row.update(ok=False, error=f"{type(e).__name__}: {str(e)[:400]}")
    rows.append(row)
print(json.dumps(rows))
'''


def triton_modules(preset: str) -> dict[str, str]:
    """{kernel name: Triton IR text} of one decode step of the preset's shape (2 layers, bf16), and of the token's
    draw (`fused_sample`) from its vocabulary at temperature 1 and greedy."""
    cfg = preset_config(preset, param_dtype="bfloat16").replace(num_layers=2)
    gd, params = tr.split(nnx.eval_shape(lambda: tr.create(cfg, jax.random.key(0))))
    cache = jax.eval_shape(lambda: tr.split_cache(tr.init_cache(cfg, 1, 256)))

    def step(params, tok, pos, cache, idx):
        m = tr.merge(gd, params)
        return fd.decode_step(m, m.layer_list(fused=True), tok, pos, cache, idx)

    i32 = jax.ShapeDtypeStruct((1,), jnp.int32)
    padded, N = fd.stat_tiles(cfg.vocab_size)[1], 128
    vec = lambda n, dt=jnp.float32: jax.ShapeDtypeStruct((n,), dt)  # noqa: E731
    draw_args = (i32, vec(N), vec(cfg.vocab_size), vec(padded), vec(padded), jax.ShapeDtypeStruct((1, N), jnp.int32),
                 jax.ShapeDtypeStruct((1, N), jnp.float32))
    buf = io.StringIO()
    fd.DEBUG = True
    try:
        with contextlib.redirect_stdout(buf), abstract_gpu():  # jax 0.11: the target GPU from the mesh in context
            jax.jit(step).trace(params, i32, i32, cache, jax.ShapeDtypeStruct((), jnp.int32)).lower(
                lowering_platforms=("cuda",))
            for temp in (1.0, 0.0):
                draw = functools.partial(fused_sample.sample, temperature=temp, stops=(2,))
                jax.jit(draw).trace(*draw_args).lower(lowering_platforms=("cuda",))
    finally:
        fd.DEBUG = False
    out = {}
    for m in re.finditer(r"\nmodule @(\w+) \{\n(.*?)\n\} \[unknown\]\n", buf.getvalue(), re.S):
        body = re.sub(r' \[unknown\]| "[^"\n]*"\(#loc\d+\)| \(#loc\d+\)| loc\(#loc\d+\)', "", m.group(2))
        text, name = "module {\n" + body + "\n}\n", m.group(1)  # debug locations dropped
        if text in out.values():
            continue
        n = sum(k == name or k.startswith(name + "_v") for k in out)  # a variant: e.g. layer 0's qkv kernel has
        out[name if n == 0 else f"{name}_v{n + 1}"] = text  # no partials to add, the later layers' do
    return out


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="smollm2-135m")
    p.add_argument("--fused-set", default="")
    p.add_argument("--triton-python", default="/work/venvs/triton/bin/python")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    if not os.path.exists(a.triton_python):
        raise SystemExit(f"no Python with triton at {a.triton_python} (python -m venv V && V/bin/pip install triton)")
    rows = []
    for setting in a.fused_set.split(";"):
        set_fused_tiles(setting)
        mods = triton_modules(a.preset)
        with tempfile.TemporaryDirectory() as d:
            for name, text in mods.items():
                open(os.path.join(d, name + ".ttir"), "w").write(text)
            res = subprocess.run([a.triton_python, "-c", COMPILE, d, str(fd.NUM_WARPS), str(fd.NUM_STAGES)],
                                 capture_output=True, text=True, env=dict(os.environ, TRITON_DEFAULT_FP_FUSION="1"))
        if res.returncode:
            raise SystemExit(res.stderr[-3000:])
        for r in json.loads(res.stdout.strip().splitlines()[-1]):
            r.update(preset=a.preset, setting=setting or "default")
            rows.append(r)
            print(json.dumps(r), flush=True)
    set_fused_tiles("")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
