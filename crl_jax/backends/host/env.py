"""Host-side environments in a `Runtime`: a light descriptor of an adapter pool and a text -> tokens renderer.

The compiled loop needs, from an environment, only static facts (`num_tasks`, `action_names`,
`max_steps`, `task_text`) and a renderer; the simulator itself (NetHack for MiniHack) runs on the host,
one adapter instance per parallel game (`crl_jax.envs.adapters`). `HostEnv` carries those facts plus how
to make the games (`make()`); `HostRenderer` turns an observation text into fixed-width tokens.

Host-only keys of `env.params` (the rest go to the adapter's constructor):

- `legend` (bool, default true): keep the `Legend: ...` line of the text view;
- `max_obs_tokens` (int, default 256): observation width in tokens; longer texts are cut at the end, before
  a text game's last `Actions: ...` line, which is kept (the real MiniHack Room text is <= ~200 bytes with the
  legend; `HostRenderer.truncated` counts cuts).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from crl_jax.config import ConfigError
from crl_jax.envs.adapters import make_pool_adapter  # a registry: the simulators are imported only by make_adapter

HOST_KEYS = {"legend": True, "max_obs_tokens": 256}
# Adapters whose action set is fixed (one constrained token per action); text adapters change it per state.
_FIXED_ACTIONS = ("minihack-room",)
# The goal line of text games, whose own goal is stated in their first observation (it differs per game).
TEXT_GOAL = "Win the game. The task is stated in the first thing you see."
# What an LLM actor's system prompt lists as its moves when the commands change per state.
TEXT_ACTIONS = 'one of the commands listed after "Actions:" in what you see now'


@dataclass(frozen=True, eq=False)
class HostEnv:
    """Static description of one pool of a host adapter (train or eval); `make()` builds one game."""

    name: str
    adapter_params: dict = field(hash=False)  # constructor kwargs of the adapter (without pool keys)
    pool: str
    num_tasks: int
    pool_seed: int
    action_names: tuple
    task_text: str
    max_steps: int
    legend: bool = True
    max_obs_tokens: int = 256
    is_host: bool = True

    @property
    def fixed_actions(self) -> bool:
        """One action set for every state (MiniHack's compass moves); else per-state admissible commands."""
        return self.name in _FIXED_ACTIONS

    def make(self):
        return make_pool_adapter(self.name, pool=self.pool, num_tasks=self.num_tasks, pool_seed=self.pool_seed,
                                 **self.adapter_params)


def host_envs(cfg, text_actions: bool = False) -> tuple[HostEnv, HostEnv]:
    """(train pool, eval pool) descriptors of `cfg.env` (a host adapter name); probes one game.
    `text_actions`: the caller's actor answers in free text (the LLM path), so adapters whose commands change
    from state to state are allowed (the tiny models' one constrained token per action cannot express them)."""
    e = cfg.env
    if e.name not in _FIXED_ACTIONS and not text_actions:
        raise ConfigError(f"env.name={e.name!r}: this host adapter has a per-state action set (admissible "
                          "commands), which the constrained one-token actions of the tiny loop cannot express; "
                          f"host adapters with a fixed action set: {list(_FIXED_ACTIONS)} (an LLM actor "
                          "plays every host adapter)")
    params = dict(e.params)
    host = {k: params.pop(k, v) for k, v in HOST_KEYS.items()}
    for k in ("pool", "num_tasks", "pool_seed"):
        if k in params:
            raise ConfigError(f"env.params.{k}: set by the run (env.num_train_tasks / num_eval_tasks / pool_seed)")
    try:
        probe = make_pool_adapter(e.name, pool="train", num_tasks=e.num_train_tasks, pool_seed=e.pool_seed, **params)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"env: cannot make host adapter {e.name!r} with params {e.params}: {err}") from None
    fixed = e.name in _FIXED_ACTIONS  # text adapters: no actions before a reset, their goal is in the first view
    facts = {"action_names": tuple(probe.action_names) if fixed else (),
             "task_text": probe.task_text if fixed else TEXT_GOAL, "max_steps": int(probe.max_steps)}
    close = getattr(probe, "close", None)
    if close is not None:
        close()

    def one(pool, n):
        return HostEnv(name=e.name, adapter_params=params, pool=pool, num_tasks=n, pool_seed=e.pool_seed,
                       legend=bool(host["legend"]), max_obs_tokens=int(host["max_obs_tokens"]), **facts)

    return one("train", e.num_train_tasks), one("eval", e.num_eval_tasks)


@dataclass(eq=False)
class HostRenderer:
    """`renderer(text) -> (tokens int32[max_len], length)`; `batch(texts) -> ([N, max_len], [N])` (numpy).

    Positions >= length hold `pad_id`. With `legend=False` the trailing `Legend: ...` line is dropped.
    """

    tokenizer: object
    max_len: int
    legend: bool = True
    pad_id: int = 0
    truncated: int = 0  # texts cut to max_len so far (host-side counter, not a metric)

    def text(self, text: str) -> str:
        if not self.legend:
            head, sep, last = text.rpartition("\n")
            if sep and last.startswith("Legend:"):
                text = head
        return text

    def __call__(self, text: str):
        text = self.text(text)
        ids = list(self.tokenizer.encode(text))
        if len(ids) > self.max_len:
            self.truncated += 1
            ids = self.cut(text, ids)
        out = np.full((self.max_len,), self.pad_id, np.int32)
        out[: len(ids)] = ids
        return out, np.int32(len(ids))

    def cut(self, text: str, ids: list) -> list:
        """`max_len` tokens of a too long text: its end is cut, but a last `Actions: ...` line (a text game's
        admissible commands, which the actor must choose from) is kept whole when it fits: the text before it is
        cut instead."""
        head, sep, last = text.rpartition("\n")
        if sep and last.startswith("Actions:"):
            tail = list(self.tokenizer.encode(sep + last))
            if len(tail) < self.max_len:
                return list(self.tokenizer.encode(head))[: self.max_len - len(tail)] + tail
        return ids[: self.max_len]

    def batch(self, texts):
        rows = [self(t) for t in texts]
        return np.stack([r[0] for r in rows]), np.array([r[1] for r in rows], np.int32)


def make_host_renderer(env: HostEnv, tokenizer) -> HostRenderer:
    return HostRenderer(tokenizer=tokenizer, max_len=env.max_obs_tokens, legend=env.legend,
                        pad_id=int(getattr(tokenizer, "pad_id", 0) or 0))


def check_llm_host(cfg) -> None:
    """ConfigErrors of an LLM config on a host adapter (what its turn-at-a-time driver cannot do)."""
    if cfg.rollout.share_prefix:
        raise ConfigError(f"rollout.share_prefix: env {cfg.env.name!r} steps on the host, one compiled call per "
                          "turn, so no episode-long program carries the conversation's cache; set it false")
