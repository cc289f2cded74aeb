"""Why the format prior's extractor answers `return`: P(first op word) at the op position, base vs format prior,
on held-out synthetic distillation rows (key 123). Usage: python experiments/llm_op_probe.py (reads the
format-prior cache of experiments/llm_probe.py's dark run in /tmp/crl_fp_cache)."""
import glob
import jax, jax.numpy as jnp, numpy as np

import crl_jax.llm as L
from crl_jax.config import load
from crl_jax.llm import format_prior as fpm
from crl_jax.models import lora, transformer as tr
ov = ["env.max_turns=1", "actor.dtype=float32", "extractor.dtype=float32", "env.num_train_tasks=16", "env.num_eval_tasks=4",
      "rollout.groups=1", "rollout.group_size=2", "bank.capacity=64", "rollout.max_action_tokens=16",
      "extraction.prompt_len=1024", "extraction.max_new_tokens=64", "format_prior.actor_steps=8", "format_prior.extractor_steps=8"]
cfg = load("experiments/configs/smollm2_room.yaml", ov)
rt = L.build(cfg)
tok = rt.tokenizer
ad = fpm._load(glob.glob("/tmp/crl_fp_cache/format-prior-*.npz")[0], fpm.adapter_template(rt))
base = jax.tree_util.tree_map(jnp.asarray, rt.extractor_weights)
s = lora.scale(cfg.lora.rank, cfg.lora.alpha)
toks, mask = jax.jit(lambda k: fpm.extractor_rows(rt, k, 8))(jax.random.key(123))
add_id, ret_id = tok.encode(' "add')[0], tok.encode(' "return')[0]
print("op tokens", tok.encode('{"op": "add"'), tok.encode('{"op": "return"'))
@jax.jit
def probs(p, t, n):
    lg = tr.apply(rt.extractor_graphdef, p, t[None])[0, n - 1]
    return jax.nn.softmax(lg.astype(jnp.float32))
merged = jax.jit(lambda b, a: lora.merge(b, a, s))(base, ad["extractor"])
for i in range(8):
    t, m = np.asarray(toks[i]), np.asarray(mask[i])
    st = int(np.argmax(m))
    tgt = tok.decode(t[m].tolist())
    ids = t.tolist()
    # j: the position of the op word ('add' / 'return') in the target
    for j in range(st, st + 12):
        w = tok.token_text(ids[j])
        if "add" in w or "return" in w:
            break
    pb = probs(base, jnp.asarray(t), j); pp = probs(merged, jnp.asarray(t), j)
    A, R = tok.encode("add")[0], tok.encode("return")[0]  # single tokens of SmolLM2
    print(f"target {tgt[:24]!r}: base P(add) {float(pb[A]):.3f} P(return) {float(pb[R]):.3f} | prior P(add) {float(pp[A]):.3f} P(return) {float(pp[R]):.3f}")
