"""Why the format prior's extractor answers `return`: P(op token) at the op position, base vs format prior,
on held-out synthetic distillation rows (key 123). The op token is `format_prior.op_target`'s: the first
token where the add and the return targets differ (SmolLM2: 'add' 2104 / 'return' 5406, after ' "').
Usage: python experiments/llm_op_probe.py [ADAPTERS.npz] (default: the format-prior cache of
experiments/llm_probe.py's dark run in /tmp/crl_fp_cache)."""
import glob
import sys
import jax, jax.numpy as jnp, numpy as np

from crl_jax.loop.runtime import build
from crl_jax.backends.llm import format_prior as fpm
from crl_jax.config import load
from crl_jax.models import lora, transformer as tr
ov = ["env.max_turns=1", "actor.dtype=float32", "extractor.dtype=float32", "env.num_train_tasks=16", "env.num_eval_tasks=4",
      "rollout.groups=1", "rollout.group_size=2", "bank.capacity=64", "rollout.max_action_tokens=16",
      "extraction.prompt_len=1024", "extraction.max_new_tokens=64", "format_prior.actor_steps=8", "format_prior.extractor_steps=8"]
cfg = load("experiments/configs/smollm2_room.yaml", ov)
rt = build(cfg)
tok = rt.tokenizer
path = sys.argv[1] if len(sys.argv) > 1 else glob.glob("/tmp/crl_fp_cache/format-prior-*.npz")[0]
ad = fpm._load(path, fpm.adapter_template(rt))
base = jax.tree_util.tree_map(jnp.asarray, rt.llm.extractor_weights)
s = lora.scale(cfg.lora.rank, cfg.lora.alpha)
toks, mask = jax.jit(lambda k: fpm.extractor_rows(rt, k, 8))(jax.random.key(123))
off, (A, R), _ = fpm.op_target(rt)
print("op token", off, "from the target's start:", [tok.token_text(int(i)) for i in (A, R)], (int(A), int(R)))
@jax.jit
def probs(p, t, n):
    lg = tr.apply(rt.extractor_graphdef, p, t[None])[0, n - 1]
    return jax.nn.softmax(lg.astype(jnp.float32))
merged = jax.jit(lambda b, a: lora.merge(b, a, s))(base, ad["extractor"])
for i in range(8):
    t, m = np.asarray(toks[i]), np.asarray(mask[i])
    st = int(np.argmax(m))
    tgt = tok.decode(t[m].tolist())
    j = st + off  # the op token's position
    pb = probs(base, jnp.asarray(t), j); pp = probs(merged, jnp.asarray(t), j)
    print(f"target {tgt[:24]!r}: base P(add) {float(pb[A]):.3f} P(return) {float(pb[R]):.3f} | prior P(add) {float(pp[A]):.3f} P(return) {float(pp[R]):.3f}")
