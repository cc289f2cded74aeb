"""Do the piecewise prompt ids change what SmolLM2 does? (issue #17, build item 4; CPU-sized)

    python experiments/llm_tokenization_probe.py [--episodes 16] [--lit] [key=value ...]

The LLM path tokenizes its prompt pieces one by one (template literals between slots, every glyph of an
observation), so a prompt's ids are a valid encoding of its text but not the tokenizer's own. For the
first-turn prompts of `--episodes` levels (the loop's default prompt variant), this compares the
piecewise ids with `encode(decode(ids))` (the canonical ids of the same text): lengths, and the model's
next-token distribution at the reply's first position (with the prefilled `<answer>` that token decides
validity): the probability mass on the move names' first tokens, the greedy token, and KL(piecewise ||
canonical). One forward per prompt, no sampling.
"""

from __future__ import annotations

import argparse
import os

import jax
import jax.numpy as jnp
import numpy as np

from crl_jax.loop.runtime import build
from crl_jax.backends.llm.prompt_pieces import actor_head, user_turn
from crl_jax.config import load
from crl_jax.models import transformer as tr
from crl_jax.text.packing import pack_segments

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--lit", action="store_true")
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args(argv)
    ov = ["env.max_turns=1", "actor.dtype=float32", "extractor.dtype=float32", "env.num_train_tasks=16",
          "env.num_eval_tasks=4", "rollout.groups=1", "rollout.group_size=2", "bank.capacity=64",
          "rollout.max_action_tokens=16", "extraction.prompt_len=1024", "extraction.max_new_tokens=64"]
    ov += (["env.params.dark=false"] if a.lit else []) + a.overrides
    cfg = load(os.path.join(ROOT, "experiments", "configs", "smollm2_room.yaml"), ov)
    rt = build(cfg)
    tok, p, N = rt.tokenizer, rt.llm.actor_pieces, a.episodes
    params = jax.tree_util.tree_map(jnp.asarray, rt.llm.actor_weights)
    tasks = jnp.arange(N, dtype=jnp.int32) % cfg.env.num_train_tasks
    states, _ = jax.vmap(rt.env.reset)(jax.random.split(jax.random.key(0), N), tasks)
    z = jnp.zeros((cfg.bank.entry_len,), jnp.int32)

    def prompt(s, tt, tl):
        obs, obs_len = rt.renderer(s)
        head = actor_head(p, z, jnp.int32(0), jnp.bool_(False), tt, tl)
        return pack_segments([head] + user_turn(p, 0, jnp.bool_(False), obs, obs_len))

    ids, lens = jax.vmap(prompt)(states, rt.train_task_tokens[tasks], rt.train_task_len[tasks])
    piece = [np.asarray(ids[i, : int(lens[i])]).tolist() for i in range(N)]
    canon = [tok.encode(tok.decode(x)) for x in piece]
    assert all(tok.decode(c) == tok.decode(x) for c, x in zip(canon, piece)), "canonical text differs"
    move_first = sorted({tok.encode(n)[0] for n in rt.env.action_names})
    W = max(len(x) for x in piece + canon)
    # one compiled forward for every prompt: right-padded to W (causal: the pad never reaches position n-1)
    fwd = jax.jit(lambda t, n: tr.apply(rt.actor_graphdef, params, t[None])[0, n - 1])
    pad = lambda x: jnp.asarray(x + [tok.pad_id] * (W - len(x)), jnp.int32)  # noqa: E731
    rows = []
    for x, c in zip(piece, canon):
        lp_x = jax.nn.log_softmax(fwd(pad(x), len(x)).astype(jnp.float32))
        lp_c = jax.nn.log_softmax(fwd(pad(c), len(c)).astype(jnp.float32))
        kl = float(jnp.sum(jnp.exp(lp_x) * (lp_x - lp_c)))
        rows.append((len(x), len(c), float(jnp.exp(lp_x[jnp.asarray(move_first)]).sum()),
                     float(jnp.exp(lp_c[jnp.asarray(move_first)]).sum()), int(jnp.argmax(lp_x)) == int(jnp.argmax(lp_c)),
                     kl))
    r = np.array(rows, float)
    print(f"{'lit' if a.lit else 'dark'} room, {N} first-turn prompts: ids piecewise {r[:, 0].mean():.0f} vs canonical "
          f"{r[:, 1].mean():.0f} (mean); P(first reply token is a move) piecewise {r[:, 2].mean():.3f} vs canonical "
          f"{r[:, 3].mean():.3f}; same greedy token {int(r[:, 4].sum())}/{N}; KL(piece || canon) mean {r[:, 5].mean():.4f}, "
          f"max {r[:, 5].max():.4f}")


if __name__ == "__main__":
    main()
