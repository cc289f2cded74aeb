"""Bank-quality time series of one CRL run on the embedded default (experiments/RESULTS.md, "Why").

Every 5 steps, replay every bank entry open-loop on the level its key matches (the built-in levels are
deterministic, so "good" = the plan reaches the stairs) and print: valid / good entries, levels holding a
good entry, entries ever credited, how often evaluation's retrieval shows a good entry, held-in success with
and without experience, and the step's extractor-op and bank metrics.

    python experiments/bank_replay.py SEED [key=value ...]     # e.g. 100 extraction.merge=true
"""
import sys, time, jax, jax.numpy as jnp, numpy as np
from crl_jax import bank as bank_lib
from crl_jax import loop
from crl_jax.actor.evaluate import pool_setup
from crl_jax.actor.experience import query_keys
from crl_jax.actor.rollout import episode_reset_keys
from crl_jax.config import load
from crl_jax.envs.actions import token_to_action
from crl_jax.loop.runtime import build
seed = int(sys.argv[1]); cfg = load(None, sys.argv[2:])
rt = build(cfg)
st = loop.init_state(rt, jax.random.key(seed), cfg)
chunk = loop.compiled_chunk(rt, 5)
def replay_fn(env):
    def replay(task, e, el, k):
        s, _ = env.reset(k, task)
        acts = token_to_action(e, rt.tiny.action_ids)
        def body(c, i):
            s, done, succ = c
            a = jnp.where(i < el, acts[i], 0)
            ns, _, r, d, info = env.step(s, a)
            live = (~done) & (i < el)
            s = jax.tree.map(lambda x, y: jnp.where(live, x, y), ns, s)
            return (s, done | (live & d.astype(bool)), succ | (live & info["success"].astype(bool))), None
        (s, d, succ), _ = jax.lax.scan(body, (s, jnp.bool_(False), jnp.bool_(False)), jnp.arange(e.shape[0]))
        return succ
    return jax.jit(jax.vmap(replay))
env = rt.env; rep_fn = replay_fn(env)
t0 = time.time()
for c in range(cfg.steps // 5):
    st, m = chunk(st, jnp.int32(5))
    m = jax.device_get(m)
    env_, renderer, key, tasks, tt, tl, exp, exp_len, has = pool_setup(rt, st, False)
    keys = episode_reset_keys(key, tasks.shape[0])
    q = query_keys(rt.embedder, env_, renderer, key, tasks, tt, tl)
    b = st.bank
    v = np.asarray(b.valid)
    sim = np.asarray(b.keys @ q.T)  # [N, n]
    lvl = sim.argmax(1); ms = sim.max(1)
    good = np.asarray(rep_fn(tasks[lvl], b.tokens, b.lengths, keys[lvl]))
    rep = np.asarray(rep_fn(tasks, exp, exp_len, keys)); has = np.asarray(has)
    n_lv_good = len(set(lvl[v & good].tolist()))
    used = np.asarray(b.times_retrieved)
    tc = np.asarray(b.total_credit_count); ts = np.asarray(b.total_credit_sum)
    val = v & (tc > 0); mc = np.where(tc > 0, ts / np.maximum(tc, 1), 0)
    slot_e = np.asarray(bank_lib.retrieve_best(b, q, jnp.zeros(q.shape[:1], jnp.int32), min_similarity=0.95, used_bonus=1e-6, credit_bonus=1e-4)[0])
    picked_val = val[np.maximum(slot_e, 0)][has].mean() if has.any() else float('nan')
    print(f"   validated {val.sum()} val_good {(val&good).sum()} val_pos {(val&(mc>0)).sum()} val_pos_good {(val&(mc>0)&good).sum()} levels_valpos_good {len(set(lvl[val&(mc>0)&good].tolist()))} eval_picked_validated {picked_val:.2f}")
    ev = m['eval_heldin_with_exp']; evo = m['eval_heldin_without_exp']
    print(f"step {int(st.step):3d} valid {v.sum():3d} good {int((v&good).sum()):3d} levels_good {n_lv_good:2d}/32 "
          f"evalhas {has.mean():.2f} evalgood {rep[has].mean() if has.any() else float('nan'):.2f} "
          f"with {np.nanmean(ev):.2f} without {np.nanmean(evo):.2f} | wrf {np.nanmean(m['write_rate_failed']):.2f} "
          f"add {np.nanmean(m['ops_add']):.1f} ret {np.nanmean(m['ops_return']):.1f} upd {np.nanmean(m['ops_update']):.1f} "
          f"pruned {np.nansum(m['pruned_entries']):.0f} merged {np.nansum(m['merged_entries']):.0f} "
          f"keysim_min {ms[v].min() if v.any() else 0:.3f} used_good {used[v&good].mean() if (v&good).any() else 0:.1f} used_bad {used[v&~good].mean() if (v&~good).any() else 0:.1f} "
          f"succ_g {np.nanmean(m['success_guided']):.2f} succ_f {np.nanmean(m['success_free']):.2f} t {time.time()-t0:.0f}", flush=True)
