"""`crl-jax` command line: train | sweep | eval | demo | pretrain | plot | bank | config | dry-run.

    crl-jax train --config experiments/configs/default.yaml [--method M] [--seed N] [--steps N]
                  [--out DIR] [--resume latest|latest_valid|never] [--overwrite] [--label L]
                  [--max-nonfinite N] [key=value ...]
    crl-jax config show [--config F] [key=value ...]   # the resolved config, every key
    crl-jax dry-run --config F [key=value ...]         # shapes, dtypes, memory per device (no weights loaded)
    crl-jax sweep --config SWEEP.yaml --out DIR [--seeds N] [--steps N] [--dry-run]   # seeds x grid, any path
    crl-jax eval DIR                      # evaluate the latest checkpoint of a run folder
    crl-jax demo [--seeds 5] [--methods crl,grpo] [--out runs/demo]   # the README's main job: table + plot
    crl-jax demo --preset coevolve [--seeds N]                       # with a frozen extractor and an archive
    crl-jax demo --preset paper [--seeds N]                          # the paper's write rules (docs/USAGE.md)
    crl-jax demo --preset families [--seeds N]                       # the family testbed (docs/USAGE.md)
    crl-jax plot DIR [DIR ...] [--out FILE]
    crl-jax bank show DIR [--task N] [--top N] | crl-jax bank export DIR --out FILE.jsonl

Errors in the config, checkpoint, bank file or run folder exit with status 2 and one line naming what is
wrong; a run stopped for too many non-finite updates exits 3; SIGINT (Ctrl-C) / SIGTERM stop a run, sweep or
demo at the next chunk boundary with a checkpoint and exit 130 / 143 (rerun to resume). docs/USAGE.md,
"Errors, exit codes and preemption".
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from crl_jax.infra.cli_errors import _one_line_warnings, report_errors  # noqa: F401  (report_errors: re-exported)


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


def cmd_sweep(args):
    from crl_jax.infra.sweep_cmd import main

    main(args)


def cmd_dry_run(args):
    from crl_jax.infra.dry_run_report import report

    print(report(_load_cfg(args)))


def cmd_config(args):
    """Print the resolved config (file + overrides, validated) as YAML with every key and, above each, its
    comment from crl_jax/config.py, so keys are discoverable and a run's exact settings can be copied."""
    import yaml

    from crl_jax.config import to_dict

    cfg = _load_cfg(args)
    if getattr(args, "comments", True):
        from crl_jax.config_doc import commented_yaml

        print(commented_yaml(cfg), end="")
    else:
        print(yaml.safe_dump(to_dict(cfg), sort_keys=False, default_flow_style=False), end="")


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

    from crl_jax.host import evaluate as host_eval
    from crl_jax.host import driver as host_loop
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
    if args.action == "replay":
        from crl_jax.infra.bank_report import bank_replay_report

        print(bank_replay_report(rt, state))
    elif args.action == "show":
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
    from crl_jax.infra.demo import demo, preset

    pre_ov, pre_methods, pre_seeds = preset(args.preset)
    methods = tuple(m.strip() for m in args.methods.split(",") if m.strip()) if args.methods else pre_methods
    demo(seeds=pre_seeds if args.seeds is None else args.seeds, first_seed=args.first_seed, out=args.out,
         steps=args.steps, config=args.config, overrides=list(pre_ov) + list(args.overrides or []), methods=methods)


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
    from crl_jax import __version__

    p = argparse.ArgumentParser(prog="crl-jax", description="Complementary RL in JAX",
                                epilog="docs/USAGE.md, 'Errors, exit codes and preemption': exit 2 bad input, 3 "
                                       "non-finite stop, 130 / 143 stopped by SIGINT / SIGTERM (rerun to resume)")
    p.add_argument("--version", action="version", version=f"crl-jax {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)

    t = sub.add_parser("train", help="train one run (resumes from the latest checkpoint in --out)",
                       epilog=OVERRIDES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("--config", default=None, help="YAML config (default: the embedded default)")
    t.add_argument("--method", default=None, choices=["crl", "grpo", "static_online", "offline", "exp_only",
                                                      "archive", "oracle_archive"],
                   help="the method (METHOD.md §4; default: the config's `method`, crl); same as method=M")
    t.add_argument("--seed", type=int, default=None, metavar="N",
                   help="run seed: the run key (default: the config's `seed`, 0); same as seed=N")
    t.add_argument("--steps", type=int, default=None, metavar="N",
                   help="training iterations, >= 1 (default: the config's `steps`, 80); a resume may raise it")
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
    c.add_argument("action", choices=["show"], help="show: print the resolved config as YAML")
    c.add_argument("--config", default=None, help="YAML config (default: the embedded default)")
    c.add_argument("--no-comments", dest="comments", action="store_false",
                   help="leave out each key's comment (from crl_jax/config.py), printed above it by default")
    c.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides, e.g. actor.lr=1e-3")
    c.set_defaults(fn=cmd_config)

    from crl_jax.infra import sweep_cmd

    sw = sub.add_parser("sweep", help="seeds x hyperparameters of any config from a sweep file (tiny: vmapped "
                        "programs; LLM / host / mesh: train's engine, member after member)",
                        description=sweep_cmd.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sweep_cmd.add_arguments(sw)
    sw.set_defaults(fn=cmd_sweep)

    dr = sub.add_parser("dry-run", help="an LLM config's shapes, dtypes, memory per device, devices and tokenizers "
                        "in seconds, without loading weights")
    dr.add_argument("--config", default=None, help="YAML config (default: the embedded default)")
    dr.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides, e.g. mesh.fsdp=8")
    dr.set_defaults(fn=cmd_dry_run)

    pt = sub.add_parser("pretrain", help="train (or load from the cache) the prior of a config (METHOD.md §6): "
                        "the tiny models' prior, or an LLM config's format prior")
    pt.add_argument("--config", default=None, help="YAML config (default: the embedded default)")
    pt.add_argument("--refit", action="store_true",
                    help="fit again into the cache even if a cached or shipped copy exists (the tiny prior: "
                    "and compare with the shipped copy)")
    pt.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides, e.g. actor.lr=1e-3")
    pt.set_defaults(fn=cmd_pretrain)

    e = sub.add_parser("eval", help="evaluate the latest checkpoint of a run folder")
    e.add_argument("run_dir", help="a run folder (crl-jax train --out): its config.json and newest checkpoint")
    e.set_defaults(fn=cmd_eval)

    d = sub.add_parser("demo", help="the embedded default: CRL vs GRPO over seeds, table and plot")
    d.add_argument("--seeds", type=int, default=None, metavar="N",
                   help="how many seeds of every method (default: the preset's: 5, coevolve and families 3)")
    d.add_argument("--first-seed", type=int, default=0, metavar="S", help="seeds S .. S+N-1 (default 0)")
    d.add_argument("--preset", default="default", choices=("default", "coevolve", "paper", "families"),
                   help="default: the embedded default's room, methods crl,grpo; coevolve: the same with the "
                        "frozen-extractor and archive controls, methods crl,static_online,grpo,archive; paper: the "
                        "room under the paper's write rules (experiments/configs/paper_rules.yaml), methods crl,grpo; "
                        "families: the family testbed (experiments/configs/families.yaml: a goal cell per family, a "
                        "layout per episode), methods crl,grpo,archive,static_online")
    d.add_argument("--methods", default=None,
                   help="comma-separated methods: crl, grpo, static_online, offline, exp_only, archive, oracle_archive, "
                        "or grpo_scratch (GRPO without the prior); default: the preset's; each beyond crl,grpo adds "
                        "~30-50%% time, over the 10-minute budget")
    d.add_argument("--steps", type=int, default=None, metavar="N",
                   help="training iterations of every run (default: the config's `steps`, 80)")
    d.add_argument("--out", default="runs/demo", help="demo folder: run folders OUT/<method>/seed<N>/, the "
                   "table comparison.txt and plot comparison.png (rerunning resumes; default runs/demo)")
    d.add_argument("--config", default=None, help="YAML config (default: the embedded default)")
    d.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides of every run")
    d.set_defaults(fn=cmd_demo)

    pl = sub.add_parser("plot", help="learning curves of run folders as a PNG")
    pl.add_argument("run_dirs", nargs="+", metavar="run_dir",
                    help="run folders (or sweep members); runs with one label are averaged into one curve")
    pl.add_argument("--out", default=None, help="PNG file to write (default: RUN_DIR/curves.png of the first)")
    pl.set_defaults(fn=cmd_plot)

    b = sub.add_parser("bank", help="inspect the experience bank of a run")
    b.add_argument("action", choices=["show", "export", "replay"],
                   help="show: print the entries, most retrieved first; export: write them as JSON lines (the "
                        "bank file of --method offline, bank.offline_path); replay: how many entries work on "
                        "their level (moves replayed; a FACT: names the goal cell)")
    b.add_argument("run_dir", help="a run folder: its newest checkpoint's bank is read")
    b.add_argument("--task", type=int, default=None, metavar="N", help="show: only the entries of task N")
    b.add_argument("--top", type=int, default=None, metavar="N", help="show: only the N most retrieved entries")
    b.add_argument("--out", default=None, metavar="FILE.jsonl", help="export: the file to write (written whole "
                   "or not at all; its first line counts the entries, so a cut copy is refused on load)")
    b.set_defaults(fn=cmd_bank)
    return p


def parse(parser: argparse.ArgumentParser, argv) -> argparse.Namespace:
    """`parser.parse_args(argv)`, but a subcommand's options may also follow its key=value overrides
    (`train a.b=1 --steps 5`): the subcommand's own parser reads its arguments intermixed."""
    argv = list(sys.argv[1:] if argv is None else argv)
    subs = next((a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})
    i = next((i for i, a in enumerate(argv) if not a.startswith("-")), None)
    if i is None or i > 0 or argv[i] not in subs:
        return parser.parse_args(argv)  # --help, --version, a missing or unknown command: argparse's message
    try:
        args = subs[argv[i]].parse_intermixed_args(argv[i + 1:])
    except TypeError:  # a subcommand with subcommands of its own: plain parsing
        return parser.parse_args(argv)
    args.cmd = argv[i]
    return args


def main(argv=None):
    args = parse(build_parser(), argv)
    _one_line_warnings()
    report_errors(args.fn, args)


if __name__ == "__main__":
    main()
