"""Can the extractor read what the actor's tokenizer wrote? The actor/extractor tokenizer check.

Each model keeps its own tokenizer and chat template. What crosses between them:

- extractor -> actor: entries, as TEXT (the extractor's reply is decoded with its tokenizer on the host,
  the entries re-encoded with the actor's; `crl_jax.extractor.ops_json`). Always possible.
- actor -> extractor: the goal, the observations and the bank's entries inside the compiled step, as token
  ids of the actor's tokenizer. They reach the extractor through an exact id map: each actor token goes to the
  extractor token spelled the same. The map is exact when every regular (non-added) actor token has one; the
  actor's added (special) tokens the extractor lacks never occur in that text and are dropped.

`tokenizer_compatibility(actor, extractor) -> CompatReport` (paths, `pkg:` specs or tokenizer objects) says
which of three holds: "same" (one vocabulary, ids equal: nothing to map), "id_map" (e.g. Qwen2.5-Instruct's
151,665 tokens and Qwen3's 151,669: one base vocabulary, Qwen3 has four more added tokens) or "refused"
(the regular vocabularies differ: a map would change the text). `report.check()` raises the one-line
ConfigError that names both files and what differs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from crl_jax.errors import ConfigError

_SHOW = 3  # differing tokens named in a message


def _vocab(tok) -> tuple[dict[str, int], set[str]]:
    """(token string -> id with added tokens, the added tokens' strings) of an `HFTokenizer` or a
    `tokenizers.Tokenizer`."""
    raw = getattr(tok, "raw", tok)
    vocab = raw.get_vocab(with_added_tokens=True)
    added = {t.content for t in raw.get_added_tokens_decoder().values()}
    return vocab, added


def id_map(actor_tok, extractor_tok) -> np.ndarray:
    """[V_actor] int32: the extractor id of the token spelled as each actor token, -1 where the extractor
    has none (such ids are dropped when an actor segment is mapped, `map_segment`)."""
    a, _ = _vocab(actor_tok)
    e, _ = _vocab(extractor_tok)
    out = np.full((max(a.values(), default=-1) + 1,), -1, np.int32)
    for s, i in a.items():
        out[i] = e.get(s, -1)
    return out


@dataclass(frozen=True)
class CompatReport:
    """What the two tokenizers share (see the module docstring)."""

    actor: str  # the files' names, for messages
    extractor: str
    mode: str  # "same" | "id_map" | "refused"
    actor_size: int  # vocabulary sizes with added tokens
    extractor_size: int
    added_only_actor: tuple[str, ...] = ()  # added tokens one side has and the other lacks
    added_only_extractor: tuple[str, ...] = ()
    regular_unmapped: tuple[str, ...] = field(default=())  # regular actor tokens with no extractor spelling

    @property
    def ok(self) -> bool:
        return self.mode != "refused"

    @property
    def message(self) -> str:
        """One line: what the two share or what differs."""
        sizes = f"{self.actor_size} vs {self.extractor_size} tokens"
        if self.mode == "same":
            return f"actor {self.actor} and extractor {self.extractor}: one vocabulary ({self.actor_size} tokens)"
        extra = "; ".join(f"only the {who} has added {_names(t)}" for who, t in
                          (("actor", self.added_only_actor), ("extractor", self.added_only_extractor)) if t)
        if self.mode == "id_map":
            return (f"actor {self.actor} and extractor {self.extractor}: one base vocabulary ({sizes}; "
                    f"{extra or 'added tokens at other ids'}): entries cross as text, the extractor reads the "
                    "actor's text through an exact id map")
        return (f"extractor: tokenizer {self.extractor} cannot read the actor's tokens ({self.actor}, {sizes}): "
                f"{len(self.regular_unmapped)} regular actor tokens have no extractor spelling "
                f"({_names(self.regular_unmapped)}); the two models need one base vocabulary")

    def check(self) -> "CompatReport":
        """self, or a ConfigError with `message` when refused."""
        if not self.ok:
            raise ConfigError(self.message)
        return self


def _names(tokens) -> str:
    shown = ", ".join(repr(t) for t in list(tokens)[:_SHOW])
    return shown + (f" and {len(tokens) - _SHOW} more" if len(tokens) > _SHOW else "")


def compare(actor_tok, extractor_tok, actor_name: str = "actor", extractor_name: str = "extractor") -> CompatReport:
    """The `CompatReport` of two loaded tokenizers."""
    a, a_added = _vocab(actor_tok)
    e, e_added = _vocab(extractor_tok)
    only_a = tuple(sorted(a_added - set(e), key=a.get))
    only_e = tuple(sorted(e_added - set(a), key=e.get))
    regular = tuple(sorted((s for s in a if s not in a_added and s not in e), key=a.get))
    mode = "same" if a == e else ("id_map" if not regular else "refused")
    return CompatReport(actor_name, extractor_name, mode, len(a), len(e), only_a, only_e, regular)


def tokenizer_compatibility(actor, extractor) -> CompatReport:
    """The `CompatReport` of two checkpoints' tokenizers. `actor` / `extractor`: a model folder, a `.gguf`
    file, a `pkg:<package>` spec (what `actor.weights` / `extractor.weights` accept) or a loaded tokenizer.
    Reads only the tokenizers (fast: no weights)."""

    def load(x):
        if isinstance(x, str):
            from crl_jax.models.checkpoint_files import load_tokenizer, resolve_weights

            return load_tokenizer(x), resolve_weights(x)
        return x, type(x).__name__

    (at, an), (et, en) = load(actor), load(extractor)
    return compare(at, et, an, en)


def map_segment(table, tokens, length):
    """(actor tokens [L], length) -> (extractor tokens [L], length) through `id_map`'s table (a jnp array):
    ids without a counterpart (-1) are dropped and the rest moved left in order, padding 0. Inside jit."""
    import jax.numpy as jnp

    L = tokens.shape[0]
    mapped = table[jnp.clip(tokens, 0, table.shape[0] - 1)]
    keep = (jnp.arange(L) < length) & (mapped >= 0)
    dest = jnp.where(keep, jnp.cumsum(keep) - 1, L)  # kept ids to their packed position, the rest past the end
    out = jnp.zeros((L + 1,), tokens.dtype).at[dest].set(jnp.where(keep, mapped, 0))[:L]
    return out, jnp.sum(keep).astype(jnp.int32)
