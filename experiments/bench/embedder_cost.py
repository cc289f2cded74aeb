"""Cost of `bank.embedder` on CPU: the retrieval steps (1-2: tasks, queries, retrieval; `loop.prepare`) of the tiny
text view, compiled, per call with `hashed` and `minilm` keys, cold (every query text new to the cache) and
warm (every text cached: what a run pays after its pool's texts were seen once), and MiniLM's cost per key
(one query text: task line + first observation, embedded alone).

    PYTHONPATH=$PWD python experiments/bench/embedder_cost.py [groups] [group_size] [tasks]

Measured on an idle 2-core AMD EPYC VM, jax 0.10.2 (G=4, K=8, 16 tasks; 32 queries a step, 3.7 distinct texts):
hashed 1.0 ms a step; minilm warm 0.9 ms a step (every query a look-up), cold 52 ms a step, 19 ms per key
(32 word pieces a query).
"""

import sys
import time

import jax
import numpy as np

sys.path.insert(0, "tests")
from _micro import micro  # noqa: E402

from crl_jax import loop  # noqa: E402
from crl_jax.loop.runtime import build  # noqa: E402


def timed(f, *a, n=5):
    out = []
    for _ in range(n):
        t = time.perf_counter()
        jax.block_until_ready(f(*a))
        out.append(time.perf_counter() - t)
    return 1e3 * float(np.median(out))


def main(G=4, K=8, tasks=16):
    view = ["rollout.view=text", "rollout.tip_window=0", "pretrain.enabled=false", f"rollout.groups={G}",
            f"rollout.group_size={K}", f"env.num_train_tasks={tasks}"]
    for name, extra in (("hashed", []), ("minilm", ["bank.embedder=minilm", "bank.key_dim=384"])):
        cfg = micro(*view, *extra)
        rt = build(cfg)
        state = loop.init_state(rt, jax.random.key(0), cfg)
        f = jax.jit(lambda s, rt=rt: loop.prepare(rt, s).q)
        jax.block_until_ready(f(state))  # compile (and, for minilm, the first step's texts)
        row = {"warm_ms_per_step": timed(f, state)}
        if name == "minilm":
            emb = rt.embedder
            steps = [state.replace(step=state.step + i) for i in range(1, 40)]
            cold = []
            for s in steps:  # a cold step: clear the cache, so every distinct query text of the step is embedded
                emb.cache.clear()
                emb.seen.clear()
                t = time.perf_counter()
                jax.block_until_ready(f(s))
                cold.append((time.perf_counter() - t, len(emb.cache)))
            row["cold_ms_per_step"] = 1e3 * float(np.median([c[0] for c in cold]))
            row["distinct_texts_per_step"] = float(np.mean([c[1] for c in cold]))
            texts = list(emb.cache)  # the last step's query texts: task line + first observation
            row["wordpieces_per_query"] = float(np.mean([len(emb.encoder.tokenizer.encode(x).ids) for x in texts]))
            t = time.perf_counter()
            for _ in range(3):
                for x in texts:
                    emb.encoder.embed_one(x)
            row["ms_per_key"] = 1e3 * (time.perf_counter() - t) / (3 * len(texts))
        print(name, {k: round(v, 2) for k, v in row.items()}, f"(G={G}, K={K}: {G * K} queries a step)", flush=True)


if __name__ == "__main__":
    main(*map(int, sys.argv[1:]))
