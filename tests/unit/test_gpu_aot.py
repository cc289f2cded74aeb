"""experiments/bench/gpu_aot.py's HLO cost table, on a program compiled for the CPU (the same HLO syntax the
deviceless H200 compile produces; that compile needs jax's CUDA plugin, which CI does not install): kernels
inside a loop are weighted by its trip count, a matmul gets 2 M N K FLOPs, an elementwise kernel its bytes in
and out, and an in-place update only the bytes it moves."""

import importlib.util
import os

import jax
import jax.numpy as jnp

_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "experiments", "bench", "gpu_aot.py")
_spec = importlib.util.spec_from_file_location("gpu_aot", _PATH)
G = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(G)


def test_loop_kernels_are_weighted_by_trip_count():
    def f(x, w):
        def body(c, _):
            return jnp.tanh(c @ w) * 2.0, None
        return jax.lax.scan(body, x, None, length=5)[0]

    txt = jax.jit(f).lower(jnp.ones((64, 32)), jnp.ones((32, 32))).compile().as_text()
    s = G.summarize(G.kernels(txt), peak=1e12, bandwidth=1e12)
    assert s["kinds"]["matmul"]["flops"] == 5 * 2 * 64 * 32 * 32
    assert s["kinds"]["matmul"]["launches"] == 5
    # the tanh-and-scale kernel: [64, 32] float32 in and out, 5 times (plus loop counters and entry copies)
    top = s["top_memory_ops"][0]
    assert top["gb"] * 1e9 == 5 * 2 * 64 * 32 * 4 and top["launches"] == 5 and top["op"].endswith("mul")
    assert abs(s["floor_s"] - (s["kinds"]["matmul"]["flops"] + s["kinds"]["memory"]["bytes"]) / 1e12) < 1e-12
    # the matmuls' bytes: both operands and the result, float32; at 1 FLOP per byte their FLOPs take longer
    mm_bytes = 5 * 4 * (64 * 32 + 32 * 32 + 64 * 32)
    assert s["kinds"]["matmul"]["bytes"] == mm_bytes
    assert abs(s["matmul_roofline_s"] - max(mm_bytes, 5 * 2 * 64 * 32 * 32) / 1e12) < 1e-12


def test_in_place_update_counts_only_the_moved_bytes():
    def f(buf, rows):
        def body(b, i):
            return jax.lax.dynamic_update_slice(b, rows[i][None] * 3.0, (i, 0)), None
        return jax.lax.scan(body, buf, jnp.arange(4))[0]

    txt = jax.jit(f, donate_argnums=0).lower(jnp.zeros((1024, 256)), jnp.ones((4, 256))).compile().as_text()
    ks = [k for k in G.kernels(txt) if k["trips"] == 4 and k["bytes"] > 100]
    # per step a 256-float row is read and written (and the [4, 256] rows read at most at the row's size), never
    # the 1 MB buffer
    assert ks and all(k["bytes"] <= 4 * 4 * 256 * 4 for k in ks)
    assert G.shape_bytes("(bf16[2,3]{1,0}, f32[4])") == 2 * 6 + 4 * 4


def test_a_fusion_reading_slices_counts_each_slice_it_reads():
    """Two halves of one operand are two reads (the packed gate / up product of `layers.swiglu`), one half is one;
    never the whole operand twice."""
    x = jnp.ones((128, 512))
    out = 128 * 256 * 4
    both = G.kernels(jax.jit(lambda x: jnp.tanh(x[:, :256]) * x[:, 256:]).lower(x).compile().as_text())
    half = G.kernels(jax.jit(lambda x: jnp.tanh(x[:, :256]) * 2.0).lower(x).compile().as_text())
    assert [k["bytes"] for k in both if k["kind"] == "memory"] == [out + 2 * out]
    assert [k["bytes"] for k in half if k["kind"] == "memory"] == [out + out]
