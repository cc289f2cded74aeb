"""`crl-jax dry-run --config F`: what an LLM config will hold, in seconds, without loading weights.

Prints each model's shapes and parameter count, the dtypes of its weights, float32 masters and optimizer state,
their total bytes, the bytes one device holds on the config's mesh (weights; masters + optimizer state; an
activation estimate of one learner micro-batch), the devices the mesh needs, and the tokenizers: whether each
model's tokenizer file exists, its vocabulary size, and whether actor and extractor share one (the LLM path
needs that). Shapes come from `crl_jax.infra.dry_run` (`jax.eval_shape`: nothing is allocated).
"""

from __future__ import annotations

import filecmp
import os

from crl_jax.infra.dry_run import dry_run
from crl_jax.backends.llm.runtime import is_llm_config, resolve_weights
from crl_jax.config import Config, ConfigError
from crl_jax.models import presets

GIB = 2.0 ** 30


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def tokenizer_file(m) -> str | None:
    """The tokenizer file a model's checkpoint would load (a folder's tokenizer.json, a .gguf's own), or None when
    the model is a preset without weights."""
    spec = m.weights or ("" if m.preset in presets.PRESETS else m.preset)
    if not spec:
        return None
    path = resolve_weights(spec)
    return path if path.endswith(".gguf") else os.path.join(path, "tokenizer.json")


def _vocab(path: str) -> int | None:
    """Vocabulary size of a tokenizer.json (None for a .gguf: its tokenizer is read with the weights)."""
    if path.endswith(".gguf"):
        return None
    from crl_jax.text.tokenizers import HFTokenizer
    return HFTokenizer.from_folder(os.path.dirname(path)).vocab_size


def tokenizer_lines(cfg: Config) -> list[str]:
    """One line per model (file, exists, vocabulary size) and one on whether the two share a tokenizer."""
    files = {name: tokenizer_file(getattr(cfg, name)) for name in ("actor", "extractor")}
    lines, vocab = [], {}
    for name, f in files.items():
        if f is None:
            lines.append(f"  {name}: no weights named (preset shapes only): no tokenizer to check")
        elif not os.path.isfile(f):
            lines.append(f"  {name}: {f}: missing")
        else:
            vocab[name] = _vocab(f)
            lines.append(f"  {name}: {f}: present, vocab {vocab[name] if vocab[name] else '(in the .gguf)'}")
    if len(vocab) == 2:
        same = files["actor"] == files["extractor"] or filecmp.cmp(files["actor"], files["extractor"], shallow=False)
        if same:
            lines.append("  shared: one tokenizer (identical files)")
        else:  # what the LLM path's build decides: one base vocabulary (an exact id map) or refused
            from crl_jax.models.tokenizer_compat import tokenizer_compatibility

            try:
                r = tokenizer_compatibility(cfg.actor.weights, cfg.extractor.weights)
                verdict = {"same": "the same vocabulary", "id_map": "one base vocabulary (entries cross by an exact id map)",
                           "refused": "refused"}[r.mode]
                lines.append(f"  shared: different files, vocab {vocab['actor']} vs {vocab['extractor']}: {verdict}"
                             + ("" if r.ok else f" ({r.message})"))
            except (OSError, ValueError, ConfigError) as e:
                lines.append(f"  shared: different files, vocab {vocab['actor']} vs {vocab['extractor']}: not checked ({e})")
    return lines


def report(cfg: Config) -> str:
    """The dry run of an LLM config as text."""
    if not is_llm_config(cfg):
        raise ConfigError("dry-run: actor.preset is 'tiny' (the built-in models); dry-run checks LLM configs")
    out = dry_run(cfg)
    lines = []
    for name in ("actor", "extractor"):
        m, dev, mc = out[name], out["per_device"][name], out[name]["config"]
        d = m["dtypes"]
        lines += [f"{name}: {mc.family} L={mc.num_layers} H={mc.hidden_size} I={mc.intermediate_size} "
                  f"heads={mc.num_heads}/{mc.num_kv_heads} V={mc.vocab_size}: {m['num_params'] / 1e9:.3f}B parameters",
                  f"  dtypes: weights {'/'.join(d['weights'])}, masters {'/'.join(d['master'])}, "
                  f"optimizer state {'/'.join(d['opt_state'])}",
                  f"  total: weights {_gib(m['param_bytes'])}, masters {_gib(m['master_bytes'])}, "
                  f"optimizer state {_gib(m['opt_bytes'])}",
                  f"  per device: weights {_gib(dev['weights'])}, "
                  f"{'LoRA adapters' if cfg.lora.train else 'masters'} + optimizer state {_gib(dev['optimizer'])}, "
                  f"activations ~{_gib(dev['activations'])} (estimate: {dev['rows']} row(s) x {dev['length']} tokens "
                  f"per micro-batch, no remat)"]
        if "adapter_params" in m:
            lines.append(f"  LoRA adapters: {m['adapter_params'] / 1e6:.1f}M parameters, "
                         f"{_gib(m['adapter_bytes'] + m['adapter_opt_bytes'])} with their optimizer state")
    sb = out["state_bytes"]
    lines += [f"state (both models, {sb['used']} fine-tuning as configured): "
              f"{_gib(sb[sb['used']])} (full {_gib(sb['full'])}, lora {_gib(sb['lora'])})",
              f"mesh: data={cfg.mesh.data} fsdp={cfg.mesh.fsdp} tensor={cfg.mesh.tensor}: "
              f"{out['devices_needed']} devices needed; {out['rollouts_per_step']} rollouts per step",
              "tokenizers:"] + tokenizer_lines(cfg)
    return "\n".join(lines)
