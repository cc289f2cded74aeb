"""The backend protocol: what every path's functions receive (`Runtime`) and provide (`Backend`).

`crl_jax.loop` holds METHOD.md §2 once (tasks and retrieval, credit, distillation, pruning, the co-update,
the merge, the metrics, the evaluation schedule, the state). A `Backend` supplies the pieces whose form
depends on the models and the environment:

| piece | built-in envs, tiny models (`backends.builtin`) | LLMs (`backends.llm.backend`) |
|---|---|---|
| `play` | `rollout.play`: one constrained action token per turn | `llm.rollout.play`: chat turns, free-text answers |
| `distill` | `distill.distill`: op token + action tokens | `llm.distill.distill`: JSON operations |
| `actor_batch` | one row per played turn (`batches.actor_batch`) | one row per conversation |
| `extractor_batch` | CISPO batch + epochs + auxiliary prior rows | CISPO batch |
| `merge` | `merge_step.maybe_merge` | `llm.merge.maybe_merge` (JSON answers) |
| `evaluate_pool` | `evaluate.evaluate_pool` | `llm.evaluate.evaluate_pool` |
| `init_models` | random init + the synthetic-data prior | pretrained weights (+ format prior) |

Host-side environments (`host.driver`) use the built-in backend's pieces for everything but the rollouts,
which their driver plays on the host between jitted turns.

Every function takes the Runtime `rt` first (but `buffer_dims`, which the Runtime is assembled from). A
`Runtime` is the static part of a run, one class for every path: the fields every path has once (config,
tokenizer, environments and renderers, task rows, merge pieces, model shapes and graph definitions,
optimizers, co-update, embedder, backend, and the bank's and the sample buffer's functions with their
hyperparameters bound, `rt.bank_ops` and `rt.buffer_ops`), and the path's own
pieces in a typed struct: `rt.tiny` (`TinyParts`: the tiny models' constrained vocabulary and prompt
pieces; built-in and host environments) or `rt.llm` (`LLMParts`: chat prompt pieces, reply parser,
loaded weights). It is built by `crl_jax.loop.runtime.build(cfg)` (one entry, one cache, the one
`normalise` below), from `crl_jax.loop.runtime` (tiny) or `crl_jax.backends.llm.runtime` (LLM).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from crl_jax import envs
from crl_jax.actor.rollout import Segments
from crl_jax.backends.host.env import HostEnv, HostRenderer
from crl_jax.backends.llm.answer import PrefilledParser
from crl_jax.backends.llm.prompt_pieces import ActorPieces, DistillPieces
from crl_jax.bank.ops import BankOps, make_bank_ops
from crl_jax.config import BankConfig, Config, ConfigError, DistributedConfig, MeshConfig
from crl_jax.envs.actions import AnswerParser
from crl_jax.envs.base import Env
from crl_jax.envs.compact import CompactRenderer
from crl_jax.envs.render import TokenRenderer
from crl_jax.extractor.buffer import BufferOps, make_buffer_ops
from crl_jax.extractor.merge_step import MergePieces, Piece
from crl_jax.learner import train_state as ts
from crl_jax.learner.loss_fns import TurnBatch, response_allowed_at
from crl_jax.models import transformer as tr
from crl_jax.models.embed import HashedNgramEmbedder
from crl_jax.models.text_embed import SentenceEncoder, TextKeyEmbedder
from crl_jax.models.tokenizer_compat import map_segment
from crl_jax.text.tokenizers import Tokenizer


@dataclass(frozen=True)
class Backend:
    name: str
    # (rt, state, prepared, key) -> episodes (an Episodes-like NamedTuple with success, reward, turns [N])
    play: Callable
    # (rt, bank, buffer, extractor params, key, step, *, task_tokens, task_len, episodes, keys, exp, exp_len,
    #  has_exp, slots, mask) -> distill.DistillOut
    distill: Callable
    # (rt, episodes, guided [G, K], split (traced bool), key) -> (actor batch, metrics)
    actor_batch: Callable
    # (rt, buffer, step, ready, key) -> (buffer, extractor batch)
    extractor_batch: Callable
    # (rt, bank, buffer, extractor params, key, step, enabled) -> (bank, buffer, entries merged)
    merge: Callable
    # (rt, state, *, heldout) -> (success with experience [], without [])
    evaluate_pool: Callable
    # (rt, cfg, actor key, extractor key) -> (actor nnx model, extractor nnx model)
    init_models: Callable
    # (cfg, merge pieces) -> (prompt width, response width) of the extractor's sample buffer (bound into
    # `rt.buffer_ops` when the Runtime is assembled)
    buffer_dims: Callable
    # (rt, episodes) -> extra per-step metrics of this path
    episode_metrics: Callable
    # compiled chunks donate the input state (two LLMs with optimizer states do not fit twice in memory)
    donate: bool = False


# ------------------------------------------------------------------------------------------------
# The Runtime: the static part of a run (nothing here is traced; what the loop carries is `LoopState`)

Renderer = TokenRenderer | CompactRenderer | HostRenderer  # observation -> (tokens [Lo], length)
# (actor state, extractor state, actor batch, extractor batch) -> (actor state, extractor state, metrics)
CoUpdate = Callable[[ts.TrainState, ts.TrainState, ts.ActorBatch | TurnBatch, ts.ExtractorBatch],
                    tuple[ts.TrainState, ts.TrainState, dict]]


class DistillTokens(NamedTuple):
    """The tiny distillation prompt's fixed pieces (`crl_jax.extractor.ops.build_distill_prompt`)."""

    header: Piece
    trajectory: Piece
    retrieved: Piece
    answer: Piece
    outcome: Piece  # (tokens [2, W], lengths [2]): row 0 the failure line, row 1 the success line


@dataclass(frozen=True, eq=False)
class TinyParts:
    """The tiny models' pieces (built-in envs and host adapters): one token per action, three operation
    tokens, the actor prompt's segments and the distillation prompt's pieces as token arrays."""

    seg: Segments  # actor prompt pieces (tip, turn markers, action prompt)
    action_ids: jax.Array  # [A] token of each action
    op_ids: jax.Array  # [3] tokens of <ADD>, <UPDATE>, <RETURN>
    distill: DistillTokens
    vocab_size: int
    eos_id: int
    min_entry: int  # extraction.min_entry: entry tokens an extractor response must write before it may stop
    # extraction.forms (`crl_jax.extractor.forms`): the form tokens (<MOVES>, <FACT>) [2] and the compact view's
    # row [H] and column [W] tokens a FACT entry is written in; None without the option
    form_ids: jax.Array | None = None
    row_ids: jax.Array | None = None
    col_ids: jax.Array | None = None

    def response_masks(self) -> tuple[jax.Array, ...]:
        """Extractor responses (distillation and merge): first token an operation, then `min_entry` entry
        tokens (actions only), then actions, operations (each starts / ends an entry) or EOS
        -> (first [V], early [V], rest [V]) bool. With the entry forms the form token follows the op token and
        the entry tokens are actions, rows or columns -> (first, early, rest, form [V])."""
        cells = None if self.form_ids is None else jnp.concatenate([self.row_ids, self.col_ids])
        return response_masks(self.vocab_size, self.op_ids, self.action_ids, self.eos_id, self.form_ids, cells)

    def response_allowed(self, num_tokens: int) -> jax.Array:
        """[num_tokens, V] per-step mask for the sampler."""
        masks = self.response_masks()
        off = jnp.arange(num_tokens)
        return response_allowed_at(*masks[:3], off, self.min_entry, *masks[3:])


def response_masks(vocab_size, op_ids, action_ids, eos_id, form_ids=None, cell_ids=None):
    """(first [V], early [V], rest [V]) bool masks of extractor responses (see `TinyParts.response_masks`);
    with `form_ids` [2] (and the entry's extra tokens `cell_ids`) also the form position's mask: a 4-tuple."""
    first = jnp.zeros((vocab_size,), bool).at[op_ids].set(True)
    early = jnp.zeros((vocab_size,), bool).at[action_ids].set(True)
    if form_ids is None:
        return first, early, first.at[action_ids].set(True).at[eos_id].set(True)
    early = early.at[cell_ids].set(True)
    form = jnp.zeros((vocab_size,), bool).at[form_ids].set(True)
    return first, early, (first | early).at[eos_id].set(True), form


@dataclass(frozen=True, eq=False)
class LLMParts:
    """The LLM path's pieces: chat-template prompt pieces, the reply parser and stop tokens, loaded weights."""

    actor_pieces: ActorPieces
    distill_pieces: DistillPieces
    answer_parser: AnswerParser | PrefilledParser  # reply tokens [R], length -> action index (-1: invalid)
    actor_stop_tokens: tuple[int, ...]  # token ids that end an actor reply (`backends.llm.answer.reply_stop_tokens`)
    actor_weights: nnx.State | None  # host params (numpy leaves), or None: random init
    extractor_weights: nnx.State | None
    # The extractor's own tokenizer (its chat template, stop and pad ids): the same object as the Runtime's
    # (the actor's) when both checkpoints hold one vocabulary. Entries reach the bank as text re-encoded
    # with the actor's; the actor's goal, observations and entries reach the extractor through `to_extractor`.
    extractor_tokenizer: Tokenizer | None = None
    to_extractor: jax.Array | None = None  # [V_actor] extractor id of each actor token (-1: none); None: one vocabulary

    def extractor_segment(self, tokens, length):
        """An actor-token segment `(tokens [L], length)` as the extractor reads it (`crl_jax.models.tokenizer_compat.map_segment`);
        unchanged with one vocabulary."""
        if self.to_extractor is None:
            return tokens, length
        return map_segment(self.to_extractor, tokens, length)


@dataclass(frozen=True, eq=False)  # hashed by identity: the compiled-chunk cache key
class Runtime:
    cfg: Config  # normalised (`normalise`): read seed, steps, method and ablation switches from the run's config
    backend: Backend  # the path's pieces of the one iteration
    tokenizer: Tokenizer  # the actor's (the bank's entries are in its tokens); the extractor's: `extractor_tokenizer`
    env: Env | HostEnv  # training pool
    eval_env: Env | HostEnv  # held-out pool
    renderer: Renderer
    eval_renderer: Renderer
    train_task_tokens: jax.Array  # [num_train_tasks, Lt] task segment of each level
    train_task_len: jax.Array  # [num_train_tasks]
    eval_task_tokens: jax.Array  # [num_eval_tasks, Lt]
    eval_task_len: jax.Array
    merge_pieces: MergePieces
    num_turns: int  # min(env.max_turns, the env's own step limit)
    actor_config: tr.TransformerConfig
    extractor_config: tr.TransformerConfig
    actor_graphdef: nnx.GraphDef
    extractor_graphdef: nnx.GraphDef
    actor_tx: optax.GradientTransformation  # built once: static parts of the train states' treedef
    extractor_tx: optax.GradientTransformation
    co_update: CoUpdate  # `train_state.make_co_update` with the path's two losses
    embedder: HashedNgramEmbedder | TextKeyEmbedder  # retrieval keys and queries (`bank.embedder`)
    bank_ops: BankOps  # the bank's functions with the `bank.*` hyperparameters bound (`bank_ops`)
    buffer_ops: BufferOps  # the sample buffer's with `extraction.*` and the backend's widths bound
    tiny: TinyParts | None = None  # the tiny models' pieces (built-in and host envs), else None
    llm: LLMParts | None = None  # the LLM path's pieces, else None

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def extractor_tokenizer(self) -> Tokenizer:
        """The tokenizer the extractor reads and writes: its own on the LLM path (`LLMParts`), else the one."""
        own = self.llm.extractor_tokenizer if self.llm is not None else None
        return own if own is not None else self.tokenizer


def normalise(cfg: Config) -> Config:
    """The config a Runtime is built from and cached by: the fields that do not shape the compiled program
    set to fixed values. Seeds enter through the run key, run lengths as traced arguments, the method and
    its ablation switches as the traced `LoopState.flags`; host-only fields and the mesh (placement:
    `crl_jax.infra.sharding`) are the run driver's. So all of them share one Runtime and one program. Kept of the
    mesh: `mesh.tensor`, since a tensor axis turns the models' `merge_gate_up` off (`ModelConfig.forward_options`).
    `extraction.merge` is kept: it sets the sample buffer's widths (merge prompts are ~4x a distillation's, and
    with merge off the extractor trains on rows as wide as its distillation samples, `Backend.buffer_dims`)."""
    return dataclasses.replace(cfg, seed=0, steps=0, checkpoint_every=1, keep_checkpoints=1, method="crl",
                               loss=dataclasses.replace(cfg.loss, group_split=True, advantage="split"),
                               bank=dataclasses.replace(cfg.bank, offline_path=""),
                               distributed=DistributedConfig(), mesh=MeshConfig(tensor=cfg.mesh.tensor))


def builtin_envs(cfg: Config) -> tuple[Env, Env]:
    """(training pool, held-out pool) of a built-in JAX environment."""
    try:
        env = envs.make(cfg.env.name, pool="train", num_tasks=cfg.env.num_train_tasks, pool_seed=cfg.env.pool_seed,
                        **cfg.env.params)
        eval_env = envs.make(cfg.env.name, pool="eval", num_tasks=cfg.env.num_eval_tasks,
                             pool_seed=cfg.env.pool_seed, **cfg.env.params)
    except (TypeError, KeyError, ValueError) as e:
        raise ConfigError(f"env: cannot make {cfg.env.name!r} with params {cfg.env.params}: {e}") from None
    return env, eval_env


def pad_rows(rows: list[list[int]], width: int | None = None, pad: int = 0) -> tuple[jax.Array, jax.Array]:
    """Token rows -> (tokens [R, width] right-padded with `pad`, lengths [R]); width: the longest row (>= 1)."""
    width = width or max(1, max(len(r) for r in rows))
    out = np.full((len(rows), width), pad, np.int32)
    for i, r in enumerate(rows):
        if len(r) > width:
            raise ValueError(f"token row of length {len(r)} exceeds width {width}")
        out[i, : len(r)] = r
    return jnp.asarray(out), jnp.asarray([len(r) for r in rows], jnp.int32)


def graphdef(mcfg: tr.TransformerConfig) -> nnx.GraphDef:
    """The static graph of a model of this shape (no parameters are materialised)."""
    return nnx.graphdef(nnx.eval_shape(lambda: tr.create(mcfg, jax.random.key(0))))


def optimizers(cfg: Config) -> tuple[optax.GradientTransformation, optax.GradientTransformation]:
    """(actor, extractor) AdamW transformations of the config."""
    a, e = cfg.actor, cfg.extractor
    return (ts.make_optimizer(lr=a.lr, weight_decay=a.weight_decay, grad_clip=a.grad_clip),
            ts.make_optimizer(lr=e.lr, weight_decay=e.weight_decay, grad_clip=e.grad_clip))


def bank_ops(b: BankConfig) -> BankOps:
    """The bank of a `bank.*` config with its hyperparameters bound once (a Runtime's `rt.bank_ops`): shape
    (`capacity`, `entry_len`, `key_dim`), `eviction`, pruning below `prune_below`, training retrieval with
    diversity re-ranking (`candidates`, `diversity_lambda`, `recent_steps`, `demote_p`, `shared_ties`),
    evaluation's top-1 (`eval_prefer_used`: similarity ties broken toward the best-credited, then the most
    used entry); both retrievals above the `min_similarity` floor (-1: none)."""
    return make_bank_ops(capacity=b.capacity, entry_len=b.entry_len, key_dim=b.key_dim, eviction=b.eviction,
                         prune_below=b.prune_below, top_k=1, candidates=b.candidates,
                         diversity_lambda=b.diversity_lambda, recent_steps=b.recent_steps, demote_p=b.demote_p,
                         min_similarity=b.min_similarity if b.min_similarity > -1.0 else None,
                         shared_ties=b.shared_ties, used_bonus=1e-6 if b.eval_prefer_used else 0.0,
                         credit_bonus=1e-4 if b.eval_prefer_used else 0.0, select=b.select)


def assemble(cfg: Config, *, actor_config: tr.TransformerConfig, extractor_config: tr.TransformerConfig,
             **fields) -> Runtime:
    """A Runtime from a path's own fields; what every path derives the same way from the config and the
    model shapes is added here: graph definitions, optimizers, the embedder, and the bank's and the sample
    buffer's functions with their hyperparameters bound once (purejaxrl's `make_train`, flashbax's
    `make_*_buffer`: the loop's functions then pass data only; the buffer's widths are the backend's
    `buffer_dims`)."""
    actor_tx, extractor_tx = optimizers(cfg)
    ec = cfg.extraction
    prompt_len, response_len = fields["backend"].buffer_dims(cfg, fields["merge_pieces"])
    buffer = make_buffer_ops(capacity=ec.buffer_capacity, prompt_len=prompt_len, response_len=response_len,
                             batch=ec.batch, cooldown=ec.cooldown, power=ec.power)
    embedder = make_embedder(cfg, fields["tokenizer"], compact=fields.get("tiny") is not None
                             and cfg.rollout.view == "compact")
    return Runtime(cfg=cfg, actor_config=actor_config, extractor_config=extractor_config,
                   actor_graphdef=graphdef(actor_config), extractor_graphdef=graphdef(extractor_config),
                   actor_tx=actor_tx, extractor_tx=extractor_tx, embedder=embedder,
                   bank_ops=bank_ops(cfg.bank), buffer_ops=buffer, **fields)


@functools.lru_cache(maxsize=2)
def _encoder(spec: str) -> SentenceEncoder:
    return SentenceEncoder.load(spec)  # loaded once per process (its jitted forward with it)


def make_embedder(cfg: Config, tokenizer, *, compact: bool = False) -> HashedNgramEmbedder | TextKeyEmbedder:
    """The retrieval embedder of `bank.embedder`: hashed n-grams of the query's tokens, or a sentence embedder
    reading the query decoded with the actor's `tokenizer` (`crl_jax.models.text_embed`). The compact view's
    queries are a level token and position tokens, no text to embed: refused there."""
    b = cfg.bank
    if b.embedder == "hashed":
        return HashedNgramEmbedder(dim=b.key_dim)
    if compact:
        raise ConfigError(f"bank.embedder={b.embedder}: rollout.view=compact queries are level and position tokens, "
                          "not text; use bank.embedder=hashed or rollout.view=text")
    try:
        enc = _encoder(b.embedder)
    except (OSError, ValueError) as e:  # a missing package or folder, an unsupported or damaged model
        raise ConfigError(f"bank.embedder: {e}") from None
    if b.key_dim != enc.dim:
        raise ConfigError(f"bank.key_dim: {b.key_dim}, but bank.embedder={b.embedder} gives {enc.dim}-wide keys; "
                          f"set bank.key_dim={enc.dim}")
    return TextKeyEmbedder(enc, tokenizer.decode)
