"""Tunix side of the comparison benchmarks; runs INSIDE the Tunix venv (see tunix_setup.sh).

    python _tunix_worker.py export 'JSON ARGS'    # prints one JSON line (the last line of stdout)
    python _tunix_worker.py serve 'JSON SETUP'    # a session: one JSON request per stdin line

Modes:
- export: build the Llama3 model with `create_dummy_model(Llama3, cfg, scale=0.1, random_seed=seed)`,
  save its parameters ('/'-joined paths) plus reference logits on a fixed batch to args["out"] (.npz).
- serve: a persistent session (`tunix_common.WorkerSession`) so that the main process can interleave one
  timed call of ours with one timed call of Tunix (the machine is shared: timing the two sides minutes
  apart measures the load as much as the code). SETUP is the sampler or agentic args plus "kind":
  - "sampler": Tunix's vanilla `Sampler` (KV cache, jit prefill + while-loop decode), temperature 1, no
    early stop (an end token that can never be sampled), prompts of P tokens (the same integer tokens the
    main process uses), N generated tokens; one request {"batch": B, "seed": s} times one whole `__call__`.
  - "agentic": Tunix's agentic rollout engine (`TrajectoryCollectEngine.collect_multiple`, the loop its
    agentic GRPO learner drives) on a FrozenLake `BaseTaskEnv` with our env's semantics and maps (Tunix
    0.1.7 ships no FrozenLake environment, so this file defines one), an agent that reads the sampled
    action token, and a model_call that runs the vanilla Sampler on the turn's prompt with all but the 4
    action tokens forbidden (constrained one-token actions, as in our rollout); one request
    {"episodes": n, "seed": s} times one collection of n episodes.
  The sampler / engine is built once and a {"ready": true, ...} line is printed; each request line is
  answered by ONE timed call as one JSON stdout line; {"quit": true} or EOF ends it. The first request of
  a shape includes Tunix's compile (its jit is per shape), so the caller sends a warm-up first.
Imports nothing from crl_jax.
"""

import asyncio
import copy
import itertools
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tunix.generate import sampler as sampler_lib
from tunix.models.dummy_model_creator import create_dummy_model
from tunix.models.llama3 import model as llama3


def build_model(shape, seed):
    cfg = llama3.ModelConfig(num_layers=shape["num_layers"], vocab_size=shape["vocab_size"],
                             embed_dim=shape["embed_dim"], hidden_dim=shape["hidden_dim"],
                             num_heads=shape["num_heads"], head_dim=shape["head_dim"],
                             num_kv_heads=shape["num_kv_heads"], rope_theta=shape["rope_theta"],
                             norm_eps=shape["norm_eps"], weight_tying=True)
    return create_dummy_model(llama3.Llama3, cfg, scale=0.1, random_seed=seed), cfg


class IntTokenizer:
    """Text = space-separated token ids (so both sides feed identical integer prompts)."""

    def encode(self, text, **kw):
        return [int(t) for t in text.split()]

    def decode(self, ids, **kw):
        return " ".join(str(int(i)) for i in ids)

    def bos_id(self):
        return 0  # falsy: Tunix adds no BOS

    def eos_id(self):
        return 1

    def pad_id(self):
        return 0


class ByteTokenizer:
    """The byte layout of crl_jax's ByteTokenizer: bytes 0-255, PAD 256, BOS 257, EOS 258, extras 259+."""

    def __init__(self, extras):
        self.extras = list(extras)

    def encode(self, text, **kw):
        return list(text.encode("utf-8"))

    def decode(self, ids, **kw):
        out = []
        for i in ids:
            i = int(i)
            out.append(chr(i) if i < 256 else (self.extras[i - 259] if i >= 259 else ""))
        return "".join(out)

    def bos_id(self):
        return 0

    def eos_id(self):
        return 258

    def pad_id(self):
        return 256


def make_sampler(model, cfg, tokenizer, cache_size):
    cc = sampler_lib.CacheConfig(cache_size=cache_size, num_layers=cfg.num_layers, num_kv_heads=cfg.num_kv_heads,
                                 head_dim=cfg.head_dim)
    return sampler_lib.Sampler(model, tokenizer, cc)


def mode_export(a):
    model, _ = build_model(a["shape"], a["seed"])
    st = nnx.state(model, nnx.Param).to_pure_dict()
    flat = {}
    for path, v in jax.tree_util.tree_flatten_with_path(st)[0]:
        flat["/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)] = np.asarray(v)
    T = 12
    toks = np.random.default_rng(0).integers(1, a["shape"]["vocab_size"], (2, T)).astype(np.int32)
    pos = np.broadcast_to(np.arange(T, dtype=np.int32), (2, T))
    mask = np.tril(np.ones((T, T), bool))[None].repeat(2, 0)
    logits, _ = model(jnp.asarray(toks), jnp.asarray(pos), None, jnp.asarray(mask))
    np.savez(a["out"], __tokens=toks, __logits=np.asarray(logits, np.float32), **flat)
    return dict(num_params=int(sum(v.size for v in flat.values())), jax=jax.__version__,
                devices=str(jax.devices()))


def sampler_engine(a):
    """Build the model and the vanilla Sampler once -> call(B, seed): one timed `__call__` at batch B."""
    shape, P, N = a["shape"], a["prompt_len"], a["new_tokens"]
    model, cfg = build_model(shape, a["seed"])
    tok = IntTokenizer()
    s = make_sampler(model, cfg, tok, P + N)
    texts = {}

    def call(B, seed):
        if B not in texts:  # the same integer prompts as the main process (rng seeded by B)
            texts[B] = [tok.decode(r) for r in np.random.default_rng(B).integers(2, shape["vocab_size"], (B, P))]
        t0 = time.perf_counter()
        # eos -1 is never sampled: every row runs all N steps (no early stop).
        out = s(texts[B], max_generation_steps=N, max_prompt_length=P, temperature=1.0, top_p=1.0,
                eos_tokens=[-1], seed=seed)
        dt = time.perf_counter() - t0
        return dict(batch=B, seconds=dt, tok_s=B * N / dt, tokens_per_row=len(out.tokens[0]))

    return call


# ---------------------------------------------------------------------------------------------
# Agentic FrozenLake


def agentic_engine(a):
    """Build the model, sampler, env and agent classes once -> call(n, seed): one timed `collect_multiple`
    over n (agent, env) pairs; the sampler seeds of that call are seed * 1e6, seed * 1e6 + 1, ..."""
    from tunix.rl.agentic.agents import agent_types, base_agent
    from tunix.rl.agentic.environments import base_environment
    from tunix.rl.agentic.trajectory import trajectory_collect_engine as tce
    from tunix.rl.rollout import base_rollout

    S = 6
    msgs = a["messages"]  # our env's message texts
    names = a["action_names"]
    dirs = [(-1, 0), (0, 1), (1, 0), (0, -1)]

    class FrozenLake(base_environment.BaseTaskEnv):
        """crl_jax frozen_lake semantics (non-slippery): 6x6, start (0,0), goal (5,5), holes given."""

        def __init__(self, task, **kw):
            super().__init__(task, max_steps=a["max_steps"], **kw)
            self.holes = np.asarray(task["holes"], bool).reshape(S, S)

        def render(self, msg):
            rows = []
            for r in range(S):
                row = ["O" if self.holes[r, c] else "." for c in range(S)]
                if r == S - 1:
                    row[S - 1] = "G"
                if r == self.pos[0]:
                    row[self.pos[1]] = "@"
                rows.append("".join(row))
            return f"t={self.step_count}\n" + msg + "\n" + "\n".join(rows) + "\n"

        def _initial_observation(self):
            self.pos = (0, 0)
            return self.render(msgs["start"])

        def _step_impl(self, action):
            if action is None or not 0 <= action < 4:
                return base_environment.EnvStepResult(self.render(msgs["invalid"]), 0.0, False, {})
            r, c = self.pos[0] + dirs[action][0], self.pos[1] + dirs[action][1]
            inside = 0 <= r < S and 0 <= c < S
            if inside:
                self.pos = (r, c)
            hole, goal = bool(self.holes[self.pos]), self.pos == (S - 1, S - 1)
            msg = msgs["hole"] if hole else msgs["goal"] if goal else "" if inside else msgs["blocked"]
            return base_environment.EnvStepResult(self.render(msg), float(goal), hole or goal, {"success": goal})

    class LakeAgent(base_agent.ConversationAgentBase):
        def update_from_model(self, response, **kw):
            self.chat_completions.append({"role": "assistant", "content": response})
            act = names.index(response.strip()[1:-1]) if response.strip()[1:-1] in names else -1
            step = agent_types.Step(chat_completions=copy.deepcopy(self.chat_completions),
                                    action=agent_types.Action(action=act), model_response=response)
            self.trajectory.steps.append(step)
            return agent_types.Action(action=act)

    model, cfg = build_model(a["shape"], a["seed"])
    tok = ByteTokenizer(a["extras"])
    P = a["prompt_len"]
    s = make_sampler(model, cfg, tok, P + 1)
    action_ids = set(a["action_ids"])
    forbidden = tuple(i for i in range(a["shape"]["vocab_size"]) if i not in action_ids)
    counter = [itertools.count()]  # replaced per call (seeded); next() on it is atomic under the GIL

    def model_call(chat, env=None, max_generation_steps=None, **kw):
        # "current" history (as our rollout): task text + this turn's observation + action prompt.
        prompt = chat[0]["content"] + chat[-1]["content"] + "Action: "
        out = s([prompt], max_generation_steps=1, max_prompt_length=P, temperature=1.0, top_p=1.0,
                forbidden_tokens=forbidden, eos_tokens=[-1], seed=next(counter[0]))
        return base_rollout.RolloutOutput(text=out.text, logits=[], tokens=out.tokens,
                                          left_padded_prompt_tokens=out.padded_prompt_tokens, logprobs=None)

    async def collect(n):
        pairs = [(LakeAgent(a["task_text"]), FrozenLake({"holes": a["holes"][i % len(a["holes"])]}))
                 for i in range(n)]
        trajs = [t async for _, t in tce.TrajectoryCollectEngine.collect_multiple(
            pairs, model_call=model_call, timeout=1e6, mode="Trajectory", overlong_filter=False)]
        return trajs

    def call(n, seed):
        counter[0] = itertools.count(seed * 10**6)
        t0 = time.perf_counter()
        trajs = asyncio.run(collect(n))
        dt = time.perf_counter() - t0
        turns = [len(t.steps) for t in trajs]
        succ = [bool(t.steps and t.steps[-1].info.get("success")) for t in trajs]
        return dict(episodes=n, seconds=dt, episodes_s=n / dt, turns=int(sum(turns)), turns_s=sum(turns) / dt,
                    mean_turns=float(np.mean(turns)), success=float(np.mean(succ)))

    return call


def serve(a):
    """The session loop (see the module docstring): build once, then one timed call per request line."""
    kind = a["kind"]
    call = {"sampler": sampler_engine, "agentic": agentic_engine}[kind](a)
    arg = {"sampler": "batch", "agentic": "episodes"}[kind]
    print(json.dumps(dict(ready=True, kind=kind, jax=jax.__version__, devices=str(jax.devices()))), flush=True)
    while True:
        line = sys.stdin.readline()
        if not line:  # EOF: the caller went away
            return
        if not line.strip():
            continue
        req = json.loads(line)
        if req.get("quit"):
            return
        print(json.dumps(call(int(req[arg]), int(req.get("seed", 0)))), flush=True)


def main():
    mode, args = sys.argv[1], json.loads(sys.argv[2])
    if mode == "serve":
        return serve(args)
    fn = {"export": mode_export}[mode]
    print(json.dumps(fn(args)))


if __name__ == "__main__":
    main()
