"""Pure helpers of the Tunix comparison benchmarks (no tunix, no venv): the weight-layout conversion, the
min / median / max read-out and the per-turn FLOP count.

A tiny random Tunix-layout tree is converted with `tunix_to_crl`; the checks are on exact element
positions (hand-derived from the two layouts) and on our model's forward against a plain numpy
re-implementation of Tunix's Llama3 block with the original Tunix-layout arrays.
"""

import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from crl_jax.models import transformer as tr

_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "experiments", "bench", "tunix_common.py")
_spec = importlib.util.spec_from_file_location("tunix_common", _PATH)
tc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tc)

SHAPE = dict(vocab_size=11, embed_dim=8, hidden_dim=12, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=4,
             rope_theta=1_000_000, norm_eps=1e-5)


def tunix_tree(seed=0):
    s = SHAPE
    rng = np.random.default_rng(seed)
    H, I, N, K, D = s["embed_dim"], s["hidden_dim"], s["num_heads"], s["num_kv_heads"], s["head_dim"]
    f = {"embedder/input_embedding": rng.normal(size=(s["vocab_size"], H)), "final_norm/w": rng.normal(size=H)}
    for i in range(s["num_layers"]):
        p = f"layers/{i}/"
        f[p + "attn/q_proj/w"] = rng.normal(size=(H, N, D))
        f[p + "attn/k_proj/w"] = rng.normal(size=(H, K, D))
        f[p + "attn/v_proj/w"] = rng.normal(size=(H, K, D))
        f[p + "attn/o_proj/w"] = rng.normal(size=(N, D, H))
        f[p + "mlp/gate_proj/kernel"] = rng.normal(size=(H, I))
        f[p + "mlp/up_proj/kernel"] = rng.normal(size=(H, I))
        f[p + "mlp/down_proj/kernel"] = rng.normal(size=(I, H))
        f[p + "input_layernorm/w"] = rng.normal(size=H)
        f[p + "post_attention_layernorm/w"] = rng.normal(size=H)
    return {k: (0.3 * v).astype(np.float32) for k, v in f.items()}


def test_shapes_and_element_positions():
    flat = tunix_tree()
    out = tc.tunix_to_crl(flat, 2)
    assert out["wq"].shape == (2, 8, 16) and out["wk"].shape == (2, 8, 8) and out["wo"].shape == (2, 16, 8)
    assert out["w_gate"].shape == (2, 8, 12) and out["w_down"].shape == (2, 12, 8)
    assert out["attn_norm"].shape == (2, 8) and "lm_head" not in out
    # q head n, dim d -> column n*D + d (head-major); layer 1 is stacked second.
    assert out["wq"][1, 5, 2 * 4 + 3] == flat["layers/1/attn/q_proj/w"][5, 2, 3]
    assert out["wk"][0, 7, 1 * 4 + 0] == flat["layers/0/attn/k_proj/w"][7, 1, 0]
    # o_proj [N, D, H] -> row n*D + d.
    assert out["wo"][0, 3 * 4 + 1, 6] == flat["layers/0/attn/o_proj/w"][3, 1, 6]
    assert out["mlp_norm"][1, 4] == flat["layers/1/post_attention_layernorm/w"][4]
    flat["lm_head/w"] = np.ones((8, 11), np.float32)
    assert tc.tunix_to_crl(flat, 2)["lm_head"].shape == (8, 11)


def _np_tunix_forward(flat, tokens):
    """numpy Llama3 forward in Tunix's layout (pre-norm, rotate-half RoPE theta 1e6, tied embedding)."""
    s = SHAPE
    T = tokens.shape[1]
    x = flat["embedder/input_embedding"][tokens]
    pos = np.arange(T)[None, :]

    def norm(x, w):
        return w * x / np.sqrt(np.mean(x ** 2, -1, keepdims=True) + s["norm_eps"])

    def rope(x):
        D = x.shape[-1]
        ts = s["rope_theta"] ** (2 * np.arange(D // 2) / D)
        ang = (pos[..., None] / ts)[..., None, :]
        a, b = x[..., :D // 2], x[..., D // 2:]
        return np.concatenate([a * np.cos(ang) - b * np.sin(ang), b * np.cos(ang) + a * np.sin(ang)], -1)

    for i in range(s["num_layers"]):
        p = f"layers/{i}/"
        h = norm(x, flat[p + "input_layernorm/w"])
        q = rope(np.einsum("btd,dnh->btnh", h, flat[p + "attn/q_proj/w"]))
        k = rope(np.einsum("btd,dkh->btkh", h, flat[p + "attn/k_proj/w"]))
        v = np.einsum("btd,dkh->btkh", h, flat[p + "attn/v_proj/w"])
        G = s["num_heads"] // s["num_kv_heads"]
        k, v = np.repeat(k, G, axis=2), np.repeat(v, G, axis=2)  # q head n uses kv head n // G
        sc = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(s["head_dim"])
        sc = np.where(np.tril(np.ones((T, T), bool)), sc, -1e30)
        pr = np.exp(sc - sc.max(-1, keepdims=True))
        pr /= pr.sum(-1, keepdims=True)
        x = x + np.einsum("btnh,nhd->btd", np.einsum("bnts,bsnh->btnh", pr, v), flat[p + "attn/o_proj/w"])
        h = norm(x, flat[p + "post_attention_layernorm/w"])
        g, u = h @ flat[p + "mlp/gate_proj/kernel"], h @ flat[p + "mlp/up_proj/kernel"]
        x = x + (g / (1 + np.exp(-g)) * u) @ flat[p + "mlp/down_proj/kernel"]
    x = norm(x, flat["final_norm/w"])
    return x @ flat["embedder/input_embedding"].T


def test_converted_weights_reproduce_tunix_forward():
    flat = tunix_tree(1)
    cfg = tc.crl_config(SHAPE)
    gd, params = tr.split(tr.create(cfg, jax.random.key(0)))
    nnx.replace_by_pure_dict(params, {k: jnp.asarray(v) for k, v in tc.tunix_to_crl(flat, 2).items()})
    tokens = np.array([[1, 5, 9, 2, 7, 3], [4, 4, 0, 10, 6, 8]], np.int32)
    ref = _np_tunix_forward({k: v.astype(np.float64) for k, v in flat.items()}, tokens)
    ours = np.asarray(tr.apply(gd, params, jnp.asarray(tokens)))
    np.testing.assert_allclose(ours, ref, atol=2e-4, rtol=2e-4)
    jitted = np.asarray(jax.jit(lambda p, t: tr.apply(gd, p, t))(params, jnp.asarray(tokens)))
    np.testing.assert_allclose(jitted, ref, atol=2e-4, rtol=2e-4)


def test_spread_is_min_median_max():
    assert tc.spread([3, 1, 2]) == (1.0, 2.0, 3.0)
    assert tc.spread([4.0, 1.0]) == (1.0, 2.5, 4.0)  # even count: the mean of the middle two
    assert tc.fmt_spread([2, 1, 4], ".1f") == "1.0 / 2.0 / 4.0"


def test_turn_flops_hand_counted():
    # SHAPE: H=8, I=12, L=2, Nq=4, Nkv=2, D=4, V=11; P=5. Per block: q/k/v 8*(4+2+2)*4 = 256 weights,
    # o 4*4*8 = 128, MLP 3*8*12 = 288 (672 in all); attention 4*Nq*D = 64 FLOP per (query, key) pair.
    # ours: layer 0 over 5 rows (2*5*672 + 64*5*5 = 8320), layer 1 q/k/v over 5 rows (2*5*256 = 2560),
    # its o + MLP for 1 row (2*416 = 832) and 1 x 5 attention (320), unembedding of 1 row (2*8*11 = 176).
    assert tc.turn_flops(SHAPE, 5, "ours") == 8320 + 2560 + 832 + 320 + 176
    # With a 2-token prefix encoded once per 4-turn episode: each turn runs 3 rows (layer 0: 2*3*672 + 64*3*5 =
    # 4992; layer 1 q/k/v 2*3*256 = 1536; o + MLP, 1 x 5 attention and unembedding as above), plus a quarter of
    # the prefix (2 layers x (2*2*672 + 64*2*2) = 5888 per episode).
    assert tc.turn_flops(SHAPE, 5, "ours", prefix_len=2, turns=4) == 4992 + 1536 + 832 + 320 + 176 + 5888 / 4
    # ... and that prefix encoded once for every 8 episodes (one encoding per distinct task text)
    assert tc.turn_flops(SHAPE, 5, "ours", prefix_len=2, turns=4, prefix_shared_by=8) == (
        4992 + 1536 + 832 + 320 + 176 + 5888 / 32)
    # Tunix: prefill of 2 layers over 5 rows against 6 cache slots (2 * (6720 + 64*5*6)), unembedding of
    # 5 rows (2*5*8*11 = 880), one decode step (2 * (2*672 + 64*6)) and its unembedding (176).
    assert tc.turn_flops(SHAPE, 5, "tunix") == 2 * (6720 + 1920) + 880 + 2 * (1344 + 384) + 176
    with pytest.raises(ValueError):
        tc.turn_flops(SHAPE, 5, "other")


def test_blocked_turn_flops_hand_counted():
    # SHAPE as above. The prefix alone: 2 layers x (2*2*672 + 64*2*2) = 5888 per encoded row.
    assert tc.prefix_flops(SHAPE, 2) == 5888
    # A row after a 2-token prefix, run at width w (keys 2 + w): layer 0 over w rows (2*w*672 + 64*w*(2+w)),
    # layer 1 q/k/v over w rows (2*w*256), o + MLP of 1 row (832), 1 x (2+w) attention, unembedding (176):
    # w = 10: 13440 + 7680 + 5120 + 832 + 768 + 176 = 28016; w = 4: 5376 + 1536 + 2048 + 832 + 384 + 176 = 10352.
    # Live rows' rest lengths 9, 5, 3 (the 0 is dead), blocks of 2, widths 4, 8, 10: blocks (9, 5) at 10 and
    # (3) at 4, the last block computed whole (2 rows).
    got = tc.blocked_turn_flops(SHAPE, [3, 9, 0, 5], [True, True, False, True], rest_width=10, prefix_len=2,
                                block=2, step=4)
    assert got == 2 * 28016 + 2 * 10352
    assert tc.blocked_turn_flops(SHAPE, [3, 9], [False, False], 10, 2, 2, 4) == 0


def test_interleave_warms_then_alternates_and_speedups_pair_the_rounds():
    order = []

    def side(name, seconds):
        def fn(seed):
            order.append((name, seed))
            return {"seconds": seconds[seed]}
        return fn

    row = tc.interleave({"ours": side("ours", [9.0, 1.0, 2.0]), "tunix": side("tunix", [9.0, 3.0, 2.0])}, 2, batch=4)
    assert order == [("ours", 0), ("tunix", 0), ("ours", 1), ("tunix", 1), ("ours", 2), ("tunix", 2)]
    assert row["batch"] == 4 and row["first"] == {"ours": 9.0, "tunix": 9.0} and len(row["load"]) == 2
    assert tc.speedups(row, "ours", "tunix") == [3.0, 1.0]  # tunix seconds / ours seconds per round
