"""The Complementary RL loop, once for every path (METHOD.md §2).

- `iteration.py`: `LoopState`, `prepare` / `iteration` / `finish`, the evaluation schedule, the scanned
  chunk, `init_state` and the pure `train(cfg, key)`;
- `runtime.py`: the static parts of a run (`Runtime`), built once per program-shaping config and cached.

What differs between paths is a backend (`crl_jax.backends`).
"""

from crl_jax.loop.iteration import (  # noqa: F401
    MethodFlags, LoopState, init_state, entry_credit, StepKeys, step_keys, sample_tasks, Prepared, prepare,
    iteration, finish, masked_mean, EVAL_KEYS, REPLAY_KEYS, eval_due, step_with_eval, run_steps, train,
    compiled_chunk,
)
