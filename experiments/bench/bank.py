"""Experience-bank retrieval latency and throughput (not a timed test).

    python experiments/bench/bank.py                          # 1k / 20k entries x 128 / 1024 queries, D=384 and 64
    python experiments/bench/bank.py --quick                  # short smoke run
    python experiments/bench/bank.py --sizes 20000,100000 --queries 1024,8192 --json /tmp/bank.json   # e.g. GPU
    python experiments/bench/bank.py --results bench.md --date YYYY-MM-DD --hardware '...'

For each (entries N, queries Q, key dim D) a full bank of N entries spread over --families task families
is built directly (random unit keys). Timed, jitted, after one compile/warm-up call, median of --reps:
- `retrieve`: crl_jax.bank.retrieve with the paper's defaults (candidates 16, lambda 0.4, recent 1 step,
  demote 0.5, top_k 1) including the usage-count update;
- `plain`: the baseline in the same process — cosine similarity + lax.top_k(1) over all entries, no family
  mask, no re-ranking, no bookkeeping; ratio = retrieve / plain;
- `add_many`: inserting --add-rows entries into the full bank (FIFO eviction), ms per call.
The device JAX picks (CPU, or a GPU when jax[cuda] is installed) is printed; nothing here is CPU-specific.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import shlex
import statistics
import sys
import time

import jax
import jax.numpy as jnp

from crl_jax import bank as B


def full_bank(n: int, d: int, families: int, entry_len: int, key) -> B.ExperienceBank:
    k1, k2, k3 = jax.random.split(key, 3)
    bank = B.init(n, entry_len, d)
    order = jnp.arange(n, dtype=jnp.int32)
    return bank.replace(
        keys=B.normalize(jax.random.normal(k1, (n, d))), task=jax.random.randint(k2, (n,), 0, families),
        valid=jnp.ones((n,), bool), insert_order=order, next_order=jnp.asarray(n, jnp.int32),
        times_retrieved=jax.random.randint(k3, (n,), 0, 5), lengths=jnp.full((n,), entry_len, jnp.int32))


def timeit(fn, *args, reps: int) -> tuple[float, float]:
    """(compile+first-call seconds, median seconds of `reps` further calls)."""
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    first = time.perf_counter() - t0
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return first, statistics.median(times)


def bench_one(n, q, d, args):
    key = jax.random.key(n * 7 + q * 3 + d)
    kb, kq, kt, kr, ka = jax.random.split(key, 5)
    bank = jax.block_until_ready(full_bank(n, d, args.families, args.entry_len, kb))
    queries = jax.random.normal(kq, (q, d))
    qtask = jax.random.randint(kt, (q,), 0, args.families)

    retrieve = jax.jit(lambda b, qs, t, r, s: B.retrieve(b, qs, t, r, s, top_k=args.top_k,
                                                        candidates=args.candidates))

    @jax.jit
    def plain(keys, qs):
        sim = jnp.matmul(B.normalize(qs), keys.T, precision=jax.lax.Precision.HIGHEST)
        return jax.lax.top_k(sim, 1)

    m = args.add_rows
    add = jax.jit(B.add_many)
    rows = (jnp.ones((m, args.entry_len), jnp.int32), jnp.full((m,), args.entry_len),
            jax.random.normal(ka, (m, d)), jnp.zeros((m,), jnp.int32), 3, jnp.arange(m), jnp.ones((m,), bool))

    c_r, t_r = timeit(retrieve, bank, queries, qtask, kr, 10, reps=args.reps)
    _, t_p = timeit(plain, bank.keys, queries, reps=args.reps)
    _, t_a = timeit(add, bank, *rows, reps=args.reps)
    return dict(entries=n, queries=q, dim=d, retrieve_ms=t_r * 1e3, queries_per_s=q / t_r, plain_ms=t_p * 1e3,
                ratio=t_r / t_p, add_ms=t_a * 1e3, compile_s=c_r - t_r)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1000,20000")
    p.add_argument("--queries", default="128,1024")
    p.add_argument("--dims", default="384,64")
    p.add_argument("--families", type=int, default=3)
    p.add_argument("--entry-len", type=int, default=64)
    p.add_argument("--top-k", type=int, default=1)
    p.add_argument("--candidates", type=int, default=16)
    p.add_argument("--add-rows", type=int, default=64)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="1k entries, 128 queries, D=64, 2 reps")
    p.add_argument("--json", help="write the rows as JSON here")
    p.add_argument("--results", help="append a markdown table to this file (e.g. bench.md)")
    p.add_argument("--date", default=datetime.date.today().isoformat())
    p.add_argument("--hardware", default=None, help="hardware description for --results")
    args = p.parse_args(argv)
    if args.quick:
        args.sizes, args.queries, args.dims, args.reps = "1000", "128", "64", 2
    ints = lambda s: [int(x) for x in s.split(",") if x]

    dev = jax.devices()[0]
    print(f"device: {dev.platform} ({dev.device_kind}), jax {jax.__version__}")
    rows = []
    header = (f"| entries | queries | D | retrieve ms | queries/s | plain top-1 ms | retrieve / plain "
              f"| add_many({args.add_rows}) ms | compile s |")
    print(header)
    for d in ints(args.dims):
        for n in ints(args.sizes):
            for q in ints(args.queries):
                r = bench_one(n, q, d, args)
                rows.append(r)
                print(f"| {n:,} | {q:,} | {d} | {r['retrieve_ms']:.2f} | {r['queries_per_s']:,.0f} | "
                      f"{r['plain_ms']:.2f} | x{r['ratio']:.2f} | {r['add_ms']:.2f} | {r['compile_s']:.1f} |",
                      flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=str(dev), jax=jax.__version__, rows=rows), f, indent=1)
    if args.results:
        hw = args.hardware or f"{platform.processor() or platform.machine()} ({dev.platform})"
        cmd = "python experiments/bench/bank.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
        lines = [f"\n## Experience bank retrieval ({args.date}, {hw}, jax {jax.__version__})\n", f"`{cmd}`\n",
                 ("Paper defaults: candidates 16, lambda 0.4, recent 1 step, demote 0.5, top_k 1; "
                  f"{args.families} task families; plain = cosine + top-1, no re-ranking (same process).\n"),
                 header,
                 "|" + "---|" * 9]
        for r in rows:
            lines.append(f"| {r['entries']:,} | {r['queries']:,} | {r['dim']} | {r['retrieve_ms']:.2f} | "
                         f"{r['queries_per_s']:,.0f} | {r['plain_ms']:.2f} | x{r['ratio']:.2f} | {r['add_ms']:.2f} | "
                         f"{r['compile_s']:.1f} |")
        with open(args.results, "a") as f:
            f.write("\n".join(lines) + "\n")
        print(f"appended to {args.results}")


if __name__ == "__main__":
    main()
