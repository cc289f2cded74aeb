"""The README's main job: CRL vs the GRPO baseline on the embedded default, several seeds, table + plot."""

from __future__ import annotations

import os

import numpy as np

from crl_jax.config import ConfigError
from crl_jax.config_rules import paper_overrides
from crl_jax.atomic import write_text_atomic
from crl_jax.infra.errors import read_json
from crl_jax.infra.plot import plot_runs, t_interval
from crl_jax.infra.sweep import run_sweep
from crl_jax.infra.sweep_spec import SweepSpec, _flat_overrides, expand

ROWS = (("late.eval_heldin_with_exp", "held-in, with exp (late)"),
        ("late.eval_heldin_without_exp", "held-in, without exp (late)"),
        ("late.eval_heldout_with_exp", "held-out, with exp (late)"),
        ("late.eval_heldout_without_exp", "held-out, without exp (late)"),
        ("eval_heldin_with_exp", "held-in, with exp (final)"), ("eval_heldin_without_exp", "held-in, without (final)"),
        ("success_guided_last10", "guided success (last 10)"), ("success_free_last10", "free success (last 10)"),
        ("success_all_last10", "train success (last 10)"), ("env_steps", "env steps"),
        # is the extractor learning? (crl_jax/loop/diagnostics.py, crl_jax/actor/replay.py)
        ("late.ops_add_rate_success", "ADD rate on success (late)"),
        ("late.ops_add_rate_fail", "ADD rate on failure (late)"),
        ("late.ops_update_rate_success", "UPDATE rate on success (late)"),
        ("late.ops_update_rate_fail", "UPDATE rate on failure (late)"),
        ("late.retrieved_credit_pos", "retrieved credit > 0 (late)"), ("late.op_entropy", "op entropy (late)"),
        ("bank_replay_success", "bank replay success (final)"))

# Paired differences (same seed) that the demo's claims are about: (label, (method, key), (method, key)).
DIFFS = (("crl with exp - grpo (held-in)", ("crl", "late.eval_heldin_with_exp"), ("grpo", "late.eval_heldin_without_exp")),
         ("crl without exp - grpo (held-in)", ("crl", "late.eval_heldin_without_exp"),
          ("grpo", "late.eval_heldin_without_exp")),
         ("crl - static_online, with exp (held-in)", ("crl", "late.eval_heldin_with_exp"),
          ("static_online", "late.eval_heldin_with_exp")),
         ("crl with exp - grpo_scratch (held-in)", ("crl", "late.eval_heldin_with_exp"),
          ("grpo_scratch", "late.eval_heldin_without_exp")),
         ("grpo_scratch - grpo (held-in)", ("grpo_scratch", "late.eval_heldin_without_exp"),
          ("grpo", "late.eval_heldin_without_exp")),
         ("crl with - without exp (held-in)", ("crl", "late.eval_heldin_with_exp"), ("crl", "late.eval_heldin_without_exp")),
         ("crl with exp - grpo (held-out)", ("crl", "late.eval_heldout_with_exp"),
          ("grpo", "late.eval_heldout_without_exp")),
         ("crl guided - free (last 10)", ("crl", "success_guided_last10"), ("crl", "success_free_last10")),
         ("crl - archive, with exp (held-in)", ("crl", "late.eval_heldin_with_exp"),
          ("archive", "late.eval_heldin_with_exp")),
         ("archive with exp - grpo (held-in)", ("archive", "late.eval_heldin_with_exp"),
          ("grpo", "late.eval_heldin_without_exp")),
         ("archive guided - free (last 10)", ("archive", "success_guided_last10"), ("archive", "success_free_last10")),
         ("crl ADD rate, failure - success (late)", ("crl", "late.ops_add_rate_fail"),
          ("crl", "late.ops_add_rate_success")),
         ("crl - archive, bank replay (final)", ("crl", "bank_replay_success"), ("archive", "bank_replay_success")))


def _get(summary: dict, key: str):
    v = summary
    for part in key.split("."):
        v = v.get(part) if isinstance(v, dict) else None
    return np.nan if v is None else float(v)


def comparison_table(results: dict[str, list[dict]]) -> str:
    """results[method] = list of summaries (one per seed, seed order) -> a text table of mean ± 95% half-width,
    then the paired (same seed) differences with their 95% t-intervals. "late" = mean of the evaluations
    of the run's second half (single evaluations swing by ±0.15)."""
    methods = list(results)
    lines = [f"{'metric':34s}" + "".join(f"{m:>22s}" for m in methods)]  # (n/a: the method has no such value)
    for key, name in ROWS:
        cells = []
        for m in methods:
            mean, hw = t_interval(np.array([_get(s, key) for s in results[m]], float))
            cells.append("n/a" if np.isnan(mean) else f"{mean:.3f} ± {hw:.3f}")
        lines.append(f"{name:34s}" + "".join(f"{c:>22s}" for c in cells))
    diff_lines = []
    for label, (ma, ka), (mb, kb) in DIFFS:
        if ma not in results or mb not in results:
            continue
        n = min(len(results[ma]), len(results[mb]))
        d = np.array([_get(results[ma][i], ka) - _get(results[mb][i], kb) for i in range(n)], float)
        mean, hw = t_interval(d)
        if np.isnan(mean):
            continue
        per_seed = " ".join(f"{x:+.2f}" for x in d)
        diff_lines.append(f"{label:40s} {mean:+.3f}  95% CI [{mean - hw:+.3f}, {mean + hw:+.3f}]   seeds: {per_seed}")
    if diff_lines:
        lines += ["", "paired differences (same seed):"] + diff_lines
    return "\n".join(lines)


# Demo methods beyond the config's `method` values: GRPO from scratch (no prior, so no auxiliary loss either;
# METHOD.md §6 reports the baseline both ways). It is a second compiled program (+~1.5 min) and 5 more runs.
EXTRA_METHODS = {"grpo_scratch": {"method": "grpo", "pretrain.enabled": False}}


# `crl-jax demo --preset NAME`: (config overrides, default methods, default seeds). `coevolve` is the embedded
# default with the frozen-extractor and archive controls beside it (4 methods x 3 seeds, to stay near the demo's 10
# minutes); `paper` the embedded default under the paper's write rules (crl_jax/config_rules.py); `families`
# experiments/configs/families.yaml as overrides of the embedded default (measured under the paper's write rules).
# Tests assert they load the same configs and that their priors ship with the package, so they run from an
# installed package too.
PRESETS = {
    "default": ((), ("crl", "grpo"), 5),
    "coevolve": ((), ("crl", "static_online", "grpo", "archive"), 3),
    "paper": (paper_overrides(), ("crl", "grpo"), 5),
    "families": (("env.params.families=true", "env.params.obstacles=3", "env.num_train_tasks=16",
                  "env.num_eval_tasks=16", "eval.tasks=64", "extraction.forms=true", "pretrain.actor_steps=3000",
                  "pretrain.batch=64", "pretrain.tip_p=0.8") + paper_overrides(),
                 ("crl", "grpo", "archive", "static_online"), 3),
}


def preset(name: str) -> tuple[tuple[str, ...], tuple[str, ...], int]:
    """(overrides, methods, seeds) of a demo preset."""
    if name not in PRESETS:
        raise ConfigError(f"--preset {name!r}: known presets are {sorted(PRESETS)}")
    return PRESETS[name]


def demo(*, seeds: int = 5, first_seed: int = 0, out: str = "runs/demo", steps: int | None = None,
         config: str | None = None, overrides: list[str] = (), methods=("crl", "grpo")) -> dict:
    """Every method over `seeds` seeds from `first_seed` (`crl_jax.infra.sweep`), each run alone with the single-run
    program (one compilation for every run: method flags are traced; on 2 CPU cores ~1.5x faster than vmapping the
    seeds), run folders `out/<method>/seed<s>/` (resumable), then the comparison table and plot. `methods`
    are config methods (crl, grpo, static_online, ...) or `EXTRA_METHODS` names (grpo_scratch)."""
    if seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {seeds}")
    ov = _flat_overrides(list(overrides) + ([f"steps={steps}"] if steps else []))
    points = {m: dict(EXTRA_METHODS.get(m, {"method": m})) for m in methods}
    if first_seed < 0:
        raise ConfigError(f"--first-seed must be >= 0, got {first_seed}")
    spec = SweepSpec(config=config, overrides=ov, points=points, seeds=tuple(range(first_seed, first_seed + seeds)),
                     per_point=True, vmap_seeds=False)
    members = expand(spec, out)
    run_sweep(spec, out, chunk=members[0].cfg.checkpoint_every, plot=False, log=lambda *_: None)
    results: dict[str, list[dict]] = {m: [] for m in methods}
    for m in members:
        results[m.point].append(read_json(os.path.join(m.run_dir, "summary.json"), error=ConfigError,
                                          what="run summary"))
    table = comparison_table(results)
    png = plot_runs([m.run_dir for m in members], os.path.join(out, "comparison.png"))
    write_text_atomic(os.path.join(out, "comparison.txt"), table + "\n")
    print("\n" + table + f"\n\nplot: {png}\ntable: {os.path.join(out, 'comparison.txt')}")
    return results
