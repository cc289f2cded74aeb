"""Tokenizers: one protocol, a byte-level tokenizer for the tiny default, and Hugging Face tokenizers.

Everything above this module talks to a `Tokenizer`:

- `encode(text) -> list[int]` (no special tokens added unless asked),
- `decode(ids) -> str` (special tokens rendered as their text, pad dropped),
- `vocab_size`, `pad_id`, `bos_id`, `eos_id`, `special_ids`,
- `apply_chat_template(messages, add_generation_prompt=True) -> str`,
- `token_text(id) -> str` for host-side glyph tables.

The byte tokenizer needs no files: ids 0..255 are raw bytes, followed by PAD, BOS, EOS and any extra
atomic tokens (the tiny default uses them for action names and extractor operations so that a
constrained decoder can pick one token per action). Hugging Face tokenizers come from a folder
(`tokenizer.json` / `tokenizer_config.json`) or from GGUF metadata (`HFTokenizer.from_gguf_metadata`).
"""

from __future__ import annotations

import datetime
import json
import os
import re
from dataclasses import dataclass, field
from typing import Protocol, Sequence, runtime_checkable

import tokenizers as hf


@runtime_checkable
class Tokenizer(Protocol):
    vocab_size: int
    pad_id: int
    bos_id: int | None
    eos_id: int | None

    def encode(self, text: str, add_special: bool = False) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def token_text(self, token_id: int) -> str: ...

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str: ...


# A minimal ChatML template used by the byte tokenizer and as a fallback when a folder has none.
CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers' filter: unlike jinja's built-in tojson it does not HTML-escape.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.datetime.now().strftime(fmt)


def _render_template(template: str, messages: list[dict], add_generation_prompt: bool, **extra) -> str:
    """Render a chat template the way transformers' `apply_chat_template` does (sandboxed jinja2,
    trim_blocks + lstrip_blocks, loop controls, `tojson`, `raise_exception`, `strftime_now`)."""
    # jinja2 is not a dependency of crl_jax (nor of transformers): imported only when a chat template is rendered
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])

    def raise_exception(msg):
        raise ValueError(f"chat template error: {msg}")

    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(template).render(
        messages=messages, add_generation_prompt=add_generation_prompt, **extra
    )


@dataclass
class ByteTokenizer:
    """Bytes 0..255, then PAD, BOS, EOS, then `extra_tokens` (matched atomically when encoding)."""

    extra_tokens: tuple[str, ...] = ()
    chat_template: str = CHATML_TEMPLATE
    _extra_ids: dict = field(init=False, repr=False)
    _pattern: re.Pattern | None = field(init=False, repr=False)

    PAD = 256
    BOS = 257
    EOS = 258
    NUM_BASE = 259

    def __post_init__(self):
        self.extra_tokens = tuple(self.extra_tokens)
        if len(set(self.extra_tokens)) != len(self.extra_tokens):
            raise ValueError(f"ByteTokenizer: duplicate extra tokens in {self.extra_tokens}")
        if any(t == "" for t in self.extra_tokens):
            raise ValueError("ByteTokenizer: extra tokens must be non-empty strings")
        self._extra_ids = {t: self.NUM_BASE + i for i, t in enumerate(self.extra_tokens)}
        # Longest first so that "<north_east>" wins over a prefix of it.
        ordered = sorted(self.extra_tokens, key=len, reverse=True)
        self._pattern = re.compile("|".join(re.escape(t) for t in ordered)) if ordered else None

    @property
    def vocab_size(self) -> int:
        return self.NUM_BASE + len(self.extra_tokens)

    @property
    def pad_id(self) -> int:
        return self.PAD

    @property
    def bos_id(self) -> int:
        return self.BOS

    @property
    def eos_id(self) -> int:
        return self.EOS

    @property
    def special_ids(self) -> tuple[int, ...]:
        return (self.PAD, self.BOS, self.EOS)

    def extra_id(self, token: str) -> int:
        try:
            return self._extra_ids[token]
        except KeyError:
            raise KeyError(f"ByteTokenizer has no extra token {token!r}; known: {self.extra_tokens}") from None

    def encode(self, text: str, add_special: bool = False) -> list[int]:
        ids: list[int] = [self.BOS] if add_special else []
        pos = 0
        if self._pattern is not None:
            for m in self._pattern.finditer(text):
                ids.extend(text[pos : m.start()].encode("utf-8"))
                ids.append(self._extra_ids[m.group(0)])
                pos = m.end()
        ids.extend(text[pos:].encode("utf-8"))
        if add_special:
            ids.append(self.EOS)
        return ids

    def token_text(self, token_id: int) -> str:
        token_id = int(token_id)
        if 0 <= token_id < 256:
            return bytes([token_id]).decode("utf-8", errors="replace")
        if token_id == self.PAD:
            return ""
        if token_id == self.BOS:
            return "<s>"
        if token_id == self.EOS:
            return "</s>"
        k = token_id - self.NUM_BASE
        if 0 <= k < len(self.extra_tokens):
            return self.extra_tokens[k]
        raise ValueError(f"token id {token_id} out of range for ByteTokenizer (vocab {self.vocab_size})")

    def decode(self, ids: Sequence[int]) -> str:
        out: list[str] = []
        buf = bytearray()
        for i in ids:
            i = int(i)
            if 0 <= i < 256:
                buf.append(i)
                continue
            if buf:
                out.append(buf.decode("utf-8", errors="replace"))
                buf = bytearray()
            out.append(self.token_text(i))
        if buf:
            out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        return _render_template(self.chat_template, messages, add_generation_prompt)


class HFTokenizer:
    """A `tokenizers.Tokenizer` plus the special ids and chat template of its model."""

    def __init__(self, tok, *, bos_id=None, eos_id=None, pad_id=None, chat_template=None, bos_token=None,
                 eos_token=None):
        self._tok = tok
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.pad_id = pad_id if pad_id is not None else (eos_id if eos_id is not None else 0)
        self.chat_template = chat_template or CHATML_TEMPLATE
        self.bos_token = bos_token
        self.eos_token = eos_token

    @property
    def raw(self):
        return self._tok

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def special_ids(self) -> tuple[int, ...]:
        return tuple(i for i in (self.pad_id, self.bos_id, self.eos_id) if i is not None)

    def encode(self, text: str, add_special: bool = False) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def token_text(self, token_id: int) -> str:
        return self._tok.decode([int(token_id)], skip_special_tokens=False)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        return _render_template(
            self.chat_template, messages, add_generation_prompt,
            bos_token=self.bos_token or "", eos_token=self.eos_token or "",
        )

    @classmethod
    def from_folder(cls, path: str) -> "HFTokenizer":
        """Load `tokenizer.json` (+ `tokenizer_config.json` for specials and the chat template)."""
        tj = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(tj):
            raise FileNotFoundError(f"no tokenizer.json in model folder {path!r}")
        from crl_jax.errors import CheckpointError, read_json

        try:
            tok = hf.Tokenizer.from_file(tj)
        except Exception as e:  # the tokenizers library raises a bare Exception for a damaged file
            raise CheckpointError(f"{tj!r} is not a valid tokenizer file: {e}") from None
        cfg = {}
        tc = os.path.join(path, "tokenizer_config.json")
        if os.path.isfile(tc):
            cfg = read_json(tc)
        try:
            return cls._from_parts(tok, cfg, path)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, OSError) as e:
            raise CheckpointError(f"{tc!r}: {e}") from None

    @classmethod
    def _from_parts(cls, tok, cfg: dict, path: str) -> "HFTokenizer":
        template = cfg.get("chat_template")
        ct_file = os.path.join(path, "chat_template.jinja")
        if template is None and os.path.isfile(ct_file):
            with open(ct_file) as f:
                template = f.read()
        if isinstance(template, list):  # list of {name, template}
            template = next((t["template"] for t in template if t.get("name") == "default"), template[0]["template"])

        def tok_str(v):
            if isinstance(v, dict):
                return v.get("content")
            return v

        bos, eos, pad = (tok_str(cfg.get(k)) for k in ("bos_token", "eos_token", "pad_token"))
        ids = {k: (tok.token_to_id(v) if v else None) for k, v in (("bos", bos), ("eos", eos), ("pad", pad))}
        return cls(tok, bos_id=ids["bos"], eos_id=ids["eos"], pad_id=ids["pad"], chat_template=template,
                   bos_token=bos, eos_token=eos)

    @classmethod
    def from_gguf_metadata(cls, meta: dict) -> "HFTokenizer":
        """Rebuild the tokenizer a GGUF file describes from its `tokenizer.*` metadata.

        `meta` maps GGUF keys to Python values (`tokenizer.ggml.tokens`, `.merges`, `.token_type`,
        `.model`, `.pre`, `.bos_token_id`, `.eos_token_id`, `.padding_token_id`, `.add_bos_token`,
        `tokenizer.chat_template`). Byte-level BPE (`tokenizer.ggml.model == "gpt2"`, used by
        SmolLM2, Llama 3, Qwen2/3) is supported; CONTROL tokens (type 3) become special added tokens
        and USER_DEFINED ones (type 4) plain added tokens, so both are matched whole.
        """
        kind = meta.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ValueError(f"GGUF tokenizer model {kind!r} is not supported (only byte-level BPE, 'gpt2')")
        tokens = list(meta["tokenizer.ggml.tokens"])
        if "tokenizer.ggml.merges" not in meta:
            raise ValueError("GGUF tokenizer has no tokenizer.ggml.merges")
        alphabet = _byte_to_unicode()
        allowed = set(alphabet.values())
        # A token written with characters outside the byte alphabet is respelled byte by byte.
        spelled = [t if set(t) <= allowed else "".join(alphabet[b] for b in t.encode("utf-8")) for t in tokens]
        vocab = {t: i for i, t in enumerate(spelled)}
        merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
        tok = hf.Tokenizer(hf.models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
        pre = meta.get("tokenizer.ggml.pre", "default")
        split = _GGUF_PRE_SPLITS.get(pre)
        if pre in _GGUF_NFC:
            tok.normalizer = hf.normalizers.NFC()
        if split is None:  # GPT-2 regex inside ByteLevel; "smollm" first isolates every digit
            parts = [hf.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
            if pre in _GGUF_DIGITS:
                parts.insert(0, hf.pre_tokenizers.Digits(individual_digits=True))
            tok.pre_tokenizer = hf.pre_tokenizers.Sequence(parts)
        else:
            tok.pre_tokenizer = hf.pre_tokenizers.Sequence([
                hf.pre_tokenizers.Split(hf.Regex(split), behavior="isolated"),
                hf.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ])
        tok.decoder = hf.decoders.ByteLevel()
        types = list(meta.get("tokenizer.ggml.token_type") or [])
        control = [hf.AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types) if k == 3 and t in vocab]
        user = [hf.AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, types) if k == 4 and t in vocab]
        if control:
            tok.add_special_tokens(control)
        if user:
            tok.add_tokens(user)

        def ident(key):
            v = meta.get(f"tokenizer.ggml.{key}")
            return int(v) if v is not None and 0 <= int(v) < len(tokens) else None

        bos, eos, pad = ident("bos_token_id"), ident("eos_token_id"), ident("padding_token_id")
        bos_tok = tokens[bos] if bos is not None else None
        if meta.get("tokenizer.ggml.add_bos_token") and bos is not None:
            tok.post_processor = hf.processors.TemplateProcessing(
                single=f"{bos_tok} $A", pair=f"{bos_tok} $A {bos_tok} $B", special_tokens=[(bos_tok, bos)])
        return cls(tok, bos_id=bos, eos_id=eos, pad_id=pad, chat_template=meta.get("tokenizer.chat_template"),
                   bos_token=bos_tok, eos_token=tokens[eos] if eos is not None else None)


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table that byte-level BPE vocabularies are spelled in."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


# llama.cpp pre-tokenizer names (`tokenizer.ggml.pre`) -> the split regex their merges were learned with.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GGUF_PRE_SPLITS = {"llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT,
                    "smaug-bpe": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT}
_GGUF_NFC = {"qwen2", "deepseek-r1-qwen"}
_GGUF_DIGITS = {"smollm"}
