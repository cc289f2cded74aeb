"""`crl-jax` command line: train | eval | demo | pretrain | plot | bank | config.

    crl-jax train --config experiments/configs/default.yaml [--method M] [--seed N] [--steps N]
                  [--out DIR] [--resume latest|latest_valid|never] [--overwrite] [--label L]
                  [--max-nonfinite N] [key=value ...]
    crl-jax config show [--config F] [key=value ...]   # the resolved config, every key
    crl-jax eval DIR                      # evaluate the latest checkpoint of a run folder
    crl-jax demo [--seeds 5] [--methods crl,grpo] [--out runs/demo]   # the README's main job: table + plot
    crl-jax plot DIR [DIR ...] [--out FILE]
    crl-jax bank show DIR [--task N] [--top N] | crl-jax bank export DIR --out FILE.jsonl

Errors in the config, checkpoint, bank file or run folder exit with status 2 and one line naming what is
wrong; a run stopped for too many non-finite updates exits 3; Ctrl-C exits 130 (rerun to resume).
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def _load_cfg(args, extra_overrides=()):
    from crl_jax.config import load
    from crl_jax.config_checks import check_text_file

    if args.config:
        check_text_file(args.config, "config file")
    ov = list(args.overrides or []) + list(extra_overrides)
    for flag in ("method", "seed", "steps"):
        v = getattr(args, flag, None)
        if v is not None:
            ov.append(f"{flag}={v}")
    return load(args.config, ov)  # no file: the embedded default (Config's defaults)


def cmd_train(args):
    from crl_jax.infra.run import run

    from crl_jax.config import ConfigError

    cfg = _load_cfg(args)
    out = args.out or os.path.join("runs", f"{cfg.method}_seed{cfg.seed}")
    if os.path.exists(out) and not os.path.isdir(out):
        raise ConfigError(f"--out {out} is a file, not a run folder")
    summary = run(cfg, out, resume=args.resume, progress=not args.quiet, label=args.label,
                  overwrite=args.overwrite, max_nonfinite=args.max_nonfinite)
    print(json.dumps(summary, indent=2, sort_keys=True))


def cmd_config(args):
    """Print the resolved config (file + overrides, validated) as YAML with every key, so keys are
    discoverable and a run's exact settings can be copied."""
    import yaml

    from crl_jax.config import to_dict

    print(yaml.safe_dump(to_dict(_load_cfg(args)), sort_keys=False, default_flow_style=False), end="")


def _restore_run(run_dir):
    """(config, runtime, restored state, step) of a run folder, on the path its config runs on."""
    import jax

    from crl_jax.infra.checkpoint import Checkpointer
    from crl_jax.config import drop_removed_keys, from_dict
    from crl_jax.infra.run import engine

    path = os.path.join(run_dir, "config.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{run_dir} is not a run folder (no config.json)")
    d = read_run_config(path)
    d.pop("label", None)
    cfg = from_dict(drop_removed_keys(d, path))
    rt, init, _, _ = engine(cfg)
    ck = Checkpointer(run_dir)
    state, step = ck.restore(init(rt, jax.random.key(cfg.seed), cfg))
    return cfg, rt, state, step


def read_run_config(path: str) -> dict:
    """A run folder's config.json as a dict; a damaged one is a ConfigError naming the file."""
    from crl_jax.config import ConfigError
    from crl_jax.infra.errors import read_json

    return read_json(path, error=ConfigError, what="run config")


def _evaluator(cfg, rt):
    """The greedy held-in / held-out evaluation of the run's path (`evaluate.evaluate_all` over the path's
    pool function: the backend's compiled one, or the host driver's)."""
    import jax

    from crl_jax.backends.host import evaluate as host_eval
    from crl_jax.backends.host import driver as host_loop
    from crl_jax.actor.evaluate import evaluate_all

    if host_loop.is_host(rt):
        return lambda s: evaluate_all(rt, s, host_eval.evaluate_pool)
    return jax.jit(lambda s: evaluate_all(rt, s, rt.backend.evaluate_pool))


def cmd_eval(args):
    cfg, rt, state, step = _restore_run(args.run_dir)
    res = {k: float(v) for k, v in _evaluator(cfg, rt)(state).items()}
    print(json.dumps({"step": step, **res}, indent=2, sort_keys=True))


def cmd_plot(args):
    from crl_jax.infra.plot import plot_runs

    out = args.out or os.path.join(args.run_dirs[0], "curves.png")
    print(plot_runs(args.run_dirs, out))  # the path written (".png" added to a name without an extension)


def cmd_bank(args):
    from crl_jax.bank.io import export_jsonl, format_entries
    from crl_jax.config import ConfigError

    if args.action == "export" and args.out and os.path.isdir(args.out):
        raise ConfigError(f"bank export --out {args.out} is a folder; name a file (e.g. {args.out}/bank.jsonl)")
    _, rt, state, _ = _restore_run(args.run_dir)
    if args.action == "show":
        print(format_entries(state.bank, rt.tokenizer, task=args.task, top=args.top))
    else:
        if not args.out:
            raise ConfigError("bank export needs --out FILE.jsonl")
        export_jsonl(state.bank, rt.tokenizer, args.out)
        print(args.out)


def cmd_pretrain(args):
    """Train the prior of a config (synthetic data only) into the cache and print its id and losses: the
    tiny models' prior, or an LLM config's format prior (its LoRA adapters)."""
    from crl_jax.backends.llm import format_prior as fpm
    from crl_jax.backends.llm.runtime import is_llm_config
    from crl_jax.learner import pretrain
    from crl_jax.loop.runtime import build

    cfg = _load_cfg(args)
    rt = build(cfg)
    if is_llm_config(cfg):  # the LLM path's format prior (crl_jax/backends/llm/format_prior.py)
        fpm.format_prior_adapters(rt, log=print, refit=args.refit)
        meta = os.path.join(pretrain.cache_dir(cfg), f"format-prior-{fpm.format_prior_id(cfg)}.json")
        print(f"format prior {fpm.format_prior_id(cfg)}: {os.path.dirname(meta)}")
        with open(meta) as f:
            print(f.read())
        return
    shipped = pretrain.shipped_path(pretrain.prior_id(cfg))
    params = pretrain.prior_params(rt, log=print, refit=args.refit)
    meta = pretrain.prior_meta_path(cfg)
    print(f"prior {pretrain.prior_id(cfg)}: {os.path.dirname(meta)}")
    with open(meta) as f:
        print(f.read())
    if args.refit and os.path.exists(shipped):  # how close a fit on this machine comes to the shipped copy
        import jax
        import numpy as np

        ref = pretrain.load_params(shipped, params)
        diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                   for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(ref)))
        print(f"largest |refit - shipped| parameter difference: {diff:.3g}")


def cmd_demo(args):
    from crl_jax.infra.demo import demo

    demo(seeds=args.seeds, first_seed=args.first_seed, out=args.out, steps=args.steps, config=args.config,
         overrides=args.overrides or [], methods=tuple(m.strip() for m in args.methods.split(",") if m.strip()))


OVERRIDES_HELP = """overrides:
  Any config field can be set after the options as a dotted key=value, the same nesting as the YAML file:
    crl-jax train --out runs/a actor.lr=1e-3 rollout.groups=8 env.params.dark=false
  Values are YAML scalars (1e-3, true, "text"); the command line wins over --config, which wins over the
  defaults. Unknown keys, wrong types and out-of-range values exit 2 naming the key.
  `crl-jax config show [--config F] [key=value ...]` prints every key with its resolved value.

resuming:
  Rerunning the same command resumes from the newest checkpoint in --out; --steps may grow (the training
  columns equal an uninterrupted run's); fewer steps than the run already has is refused (exit 2) and
  leaves the folder as it is. The saved --label is kept unless a new one is given. steps, checkpoint_every, keep_checkpoints and eval.every may
  change on a resume; any other difference is refused, naming the keys.
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="crl-jax", description="Complementary RL in JAX")
    sub = p.add_subparsers(dest="cmd", required=True)

    t = sub.add_parser("train", help="train one run (resumes from the latest checkpoint in --out)",
                       epilog=OVERRIDES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("--config", default=None, help="YAML config (default: the embedded default)")
    t.add_argument("--method", default=None, choices=["crl", "grpo", "static_online", "offline", "exp_only",
                                                                "archive"])
    t.add_argument("--seed", type=int, default=None)
    t.add_argument("--steps", type=int, default=None)
    t.add_argument("--out", default=None, help="run folder (default runs/<method>_seed<seed>)")
    t.add_argument("--resume", default="latest", choices=["latest", "latest_valid", "never"],
                   help="latest: the newest checkpoint (must be readable); latest_valid: the newest readable one "
                        "(newer unreadable ones are moved to corrupt_checkpoints/); never: start fresh (refused on "
                        "a folder holding a run unless --overwrite)")
    t.add_argument("--overwrite", action="store_true", help="delete the run already in --out and start clean")
    t.add_argument("--label", default=None, help="name of the run's group in plots (default: the folder name, or "
                                                 "the parent folder of OUT/<label>/seed<N>)")
    t.add_argument("--max-nonfinite", type=int, default=10, metavar="N",
                   help="stop (exit 3) once more than N updates were skipped for non-finite loss/gradients "
                        "(default 10)")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides, e.g. actor.lr=1e-3")
    t.set_defaults(fn=cmd_train)

    c = sub.add_parser("config", help="show the resolved config (every key)", epilog=OVERRIDES_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("action", choices=["show"])
    c.add_argument("--config", default=None, help="YAML config (default: the embedded default)")
    c.add_argument("overrides", nargs="*", metavar="key=value")
    c.set_defaults(fn=cmd_config)

    pt = sub.add_parser("pretrain", help="train (or load from the cache) the prior of a config (METHOD.md §6): "
                        "the tiny models' prior, or an LLM config's format prior")
    pt.add_argument("--config", default=None, help="YAML config (default: the embedded default)")
    pt.add_argument("--refit", action="store_true",
                    help="fit again into the cache even if a cached or shipped copy exists (the tiny prior: "
                    "and compare with the shipped copy)")
    pt.add_argument("overrides", nargs="*", metavar="key=value")
    pt.set_defaults(fn=cmd_pretrain)

    e = sub.add_parser("eval", help="evaluate the latest checkpoint of a run folder")
    e.add_argument("run_dir")
    e.set_defaults(fn=cmd_eval)

    d = sub.add_parser("demo", help="the embedded default: CRL vs GRPO over seeds, table and plot")
    d.add_argument("--seeds", type=int, default=5, help="how many seeds (default 5)")
    d.add_argument("--first-seed", type=int, default=0, help="seeds FIRST .. FIRST+SEEDS-1 (default 0)")
    d.add_argument("--methods", default="crl,grpo",
                   help="comma-separated methods: crl, grpo, static_online, offline, exp_only, archive, or grpo_scratch (GRPO "
                        "without the prior); each beyond crl,grpo adds ~30-50%% time, over the 10-minute budget")
    d.add_argument("--steps", type=int, default=None)
    d.add_argument("--out", default="runs/demo")
    d.add_argument("--config", default=None)
    d.add_argument("overrides", nargs="*")
    d.set_defaults(fn=cmd_demo)

    pl = sub.add_parser("plot", help="learning curves of run folders as a PNG")
    pl.add_argument("run_dirs", nargs="+")
    pl.add_argument("--out", default=None)
    pl.set_defaults(fn=cmd_plot)

    b = sub.add_parser("bank", help="inspect the experience bank of a run")
    b.add_argument("action", choices=["show", "export"])
    b.add_argument("run_dir")
    b.add_argument("--task", type=int, default=None)
    b.add_argument("--top", type=int, default=None)
    b.add_argument("--out", default=None)
    b.set_defaults(fn=cmd_bank)
    return p


def _one_line_warnings() -> None:
    """Warnings (e.g. a bank file's `BankFileWarning`) as one `crl-jax: warning:` line each."""
    import warnings

    warnings.formatwarning = lambda message, category, *a, **k: f"crl-jax: warning: {message}\n"


def _os_message(e: OSError) -> str:
    """An OSError as one line naming its file(s): 'PATH: Is a directory' (or the message it was raised with)."""
    if e.filename is None or not e.strerror:
        return str(e)
    names = repr(e.filename) + (f" -> {e.filename2!r}" if e.filename2 is not None else "")
    return f"{names}: {e.strerror}"


def _token_renderer_error(e: Exception) -> bool:
    """The tokenizer of an LLM checkpoint does not round-trip an environment's text (`make_token_renderer`)."""
    return isinstance(e, ValueError) and str(e).startswith("make_token_renderer:")


def report_errors(fn, *args, prog: str = "crl-jax"):
    """Call `fn(*args)`; bad input (config, checkpoint, model folder, run folder, files) exits 2 with one
    `PROG: error: ...` line, a run stopped for non-finite updates exits 3, Ctrl-C exits 130. Shared by
    `crl-jax` and experiments/sweep.py."""
    from crl_jax.config import ConfigError
    from crl_jax.infra.errors import CheckpointError

    try:
        return fn(*args)
    except (ConfigError, CheckpointError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        sys.exit(2)
    except OSError as e:  # missing files, a file where a folder is needed (or the reverse), permissions
        print(f"{prog}: error: {_os_message(e)}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt as e:  # run.Interrupted carries the step and checkpoint; else before the first step
        print(f"{prog}: {e}" if str(e) else f"{prog}: interrupted; rerun the same command to resume",
              file=sys.stderr)
        sys.exit(130)
    except Exception as e:
        from crl_jax.infra.run import Interrupted, NonFiniteError

        if isinstance(e, Interrupted):
            print(f"{prog}: {e}", file=sys.stderr)
            sys.exit(130)
        if isinstance(e, NonFiniteError):
            print(f"{prog}: error: {e}", file=sys.stderr)
            sys.exit(3)
        if _token_renderer_error(e):
            print(f"{prog}: error: actor.preset / extractor.preset: {e}", file=sys.stderr)
            sys.exit(2)
        if isinstance(e, ValueError) and str(e).startswith("build_distill_prompt: budget"):  # traced, after checks
            print(f"{prog}: error: extraction.prompt_len: {e}", file=sys.stderr)
            sys.exit(2)
        raise


def main(argv=None):
    args = build_parser().parse_args(argv)
    _one_line_warnings()
    report_errors(args.fn, args)


if __name__ == "__main__":
    main()
