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


_ASYNC_SLICE = """
%fused_slice (p0: bf16[30,576,192], p1: s32[]) -> bf16[1,576,192] {
  %p0 = bf16[30,576,192]{2,1,0} parameter(0)
  %p1 = s32[] parameter(1)
  %c = s32[] constant(0)
  ROOT %ds = bf16[1,576,192]{2,1,0} dynamic-slice(%p0, %p1, %c, %c), dynamic_slice_sizes={1,576,192}
}

ENTRY %main (stack: bf16[30,576,192], i: s32[]) -> bf16[1,576,192] {
  %stack = bf16[30,576,192]{2,1,0} parameter(0)
  %i = s32[] parameter(1)
  %fusion-start = ((bf16[30,576,192]{2,1,0}, s32[]), bf16[1,576,192]{2,1,0}, u32[]) fusion-start(%stack, %i), \
kind=kLoop, calls=%fused_slice, metadata={op_name="jit(f)/dynamic_slice"}
  ROOT %fusion-done = bf16[1,576,192]{2,1,0} fusion-done(%fusion-start), metadata={op_name="jit(f)/dynamic_slice"}
}
""".replace("\\\n", "")


def test_an_async_fusion_is_one_kernel_moving_its_result_only():
    """jax 0.11's XLA runs some fusions as fusion-start / fusion-done pairs, whose start's shape holds its operands
    next to its result: one launch, the slice read and written, not the [30, ...] stack it slices."""
    ks = G.kernels(_ASYNC_SLICE)
    one = 576 * 192 * 2
    assert [(k["trips"], k["bytes"]) for k in ks] == [(1, one + one + 4)]  # the slice in and out, and the index
    assert G._tuple_items("((bf16[30,576,192]{2,1,0}, s32[]), bf16[1,576,192]{2,1,0}, u32[])") == [
        "(bf16[30,576,192]{2,1,0}, s32[])", "bf16[1,576,192]{2,1,0}", "u32[]"]
