"""ALFWorld-style household tasks on the ALFRED PDDL domain, played by TextWorld's PDDL engine.

The real ALFWorld game files (generated from the ALFRED dataset) cannot be downloaded here, so the
tasks are small hand-written PDDL problems shipped in `data/alfworld/*.pddl`, one per ALFWorld task
type (pick-and-place, clean / heat / cool then place, look at an object in light, pick two). The domain
(`alfred.pddl`) and the text grammar (`alfred.twl2`) are the ones shipped in the `alfworld` wheel;
`textworld.envs.PddlEnv` (with the `fast-downward-textworld` planner) runs them, as ALFWorld's own
text engine does. Entity ids `apple_bar_1` are shown as `apple 1`, as ALFWorld shows them.

Each problem file starts with `;; goal: <sentence>` (the task text shown to the agent) and
`;; plan: cmd | cmd | ...` (a hand-written winning command sequence, used by the tests).

`AlfworldPddl(problems=None, max_steps=50, fail_reward=0.0)`: task `i` is the i-th problem (sorted
file names; `problems` may list other `.pddl` paths). API as the TextWorld adapter: `step` takes an
index into the state's admissible commands or a command string; reward 1.0 on success, `fail_reward`
(ALFWorld-style runs use -1.0) on the step that truncates an unsuccessful episode, else 0.0.
"""

from __future__ import annotations

import glob
import importlib.util
import os
from dataclasses import dataclass, replace

from crl_jax.envs.adapters.common import INVALID_MESSAGE, seed_to_int

DATA_DIR = os.path.join(os.path.dirname(__file__), "data", "alfworld")


def alfred_domain_files() -> tuple[str, str]:
    """Paths of `alfred.pddl` and `alfred.twl2` inside the installed `alfworld` package."""
    spec = importlib.util.find_spec("alfworld")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("AlfworldPddl needs the `alfworld` package (pip install alfworld)")
    data = os.path.join(next(iter(spec.submodule_search_locations)), "data")
    return os.path.join(data, "alfred.pddl"), os.path.join(data, "alfred.twl2")


def read_problem(path: str) -> dict:
    """{'pddl': text, 'goal': sentence, 'plan': [commands]} from a problem file's header comments."""
    text = _read(path)
    goal, plan = "", []
    for line in text.splitlines():
        if line.startswith(";; goal:"):
            goal = line.split(":", 1)[1].strip()
        elif line.startswith(";; plan:"):
            plan = [c.strip() for c in line.split(":", 1)[1].split("|") if c.strip()]
    if not goal:
        raise ValueError(f"{path}: missing the ';; goal: ...' header line")
    return {"pddl": text, "goal": goal, "plan": plan}


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def pretty_name(entity_id: str) -> str:
    """ALFRED-style id -> display name: 'apple_bar_1' -> 'apple 1'."""
    return entity_id.replace("_bar_", " ")


@dataclass(frozen=True)
class AlfworldState:
    episode: int
    task: int
    t: int
    done: bool
    won: bool
    feedback: str
    admissible: tuple[str, ...]
    goal: str


class AlfworldPddl:
    """A pool of ALFWorld-style PDDL household tasks (see module docstring)."""

    is_host = True

    def __init__(self, problems: list[str] | None = None, *, max_steps: int = 50, fail_reward: float = 0.0):
        import textworld
        from textworld.envs.pddl import PddlEnv

        self._textworld, self._pddl_env_cls = textworld, PddlEnv
        self.problem_files = list(problems) if problems else sorted(glob.glob(os.path.join(DATA_DIR, "*.pddl")))
        if not self.problem_files:
            raise ValueError(f"AlfworldPddl: no problem files (looked in {DATA_DIR})")
        self.problems = [read_problem(p) for p in self.problem_files]
        domain_path, grammar_path = alfred_domain_files()
        self._domain, self._grammar = _read(domain_path), _read(grammar_path)
        self.num_tasks, self.max_steps, self.fail_reward = len(self.problems), int(max_steps), float(fail_reward)
        self._envs: dict[int, object] = {}
        self._episode = 0
        self._latest = None

    def plan(self, task: int) -> list[str]:
        """The problem file's hand-written winning plan."""
        return list(self.problems[int(task) % self.num_tasks]["plan"])

    def planner_plan(self, task: int) -> list[str]:
        """A plan from the Fast Downward planner (via TextWorld) from the initial state."""
        env = self._env(int(task) % self.num_tasks)
        return list(env.reset()["policy_commands"])

    def _env(self, task: int):
        if task not in self._envs:
            prob = self.problems[task]
            # The grammar's task sentence is a placeholder ALFWorld fills in the same way.
            grammar = self._grammar.replace("UNKNOWN GOAL.", prob["goal"]).replace("UNKNOWN GOAL", prob["goal"])
            infos = self._textworld.EnvInfos(admissible_commands=True, won=True, policy_commands=True)
            env = self._pddl_env_cls(infos)
            env.load({"pddl_domain": self._domain, "grammar": grammar, "pddl_problem": prob["pddl"]})
            for info in env._entity_infos.values():  # display names, as ALFWorld's demangler sets them
                info.name = pretty_name(info.id)
            self._envs[task] = env
        return self._envs[task]

    # ---- API -----------------------------------------------------------------------------------
    @property
    def action_names(self) -> tuple[str, ...]:
        return self._latest.admissible if self._latest is not None else ()

    @property
    def task_text(self) -> str:
        return ("Your task is to: " + self._latest.goal) if self._latest is not None else ""

    def admissible(self, state: AlfworldState) -> tuple[str, ...]:
        return state.admissible

    def reset(self, key_or_seed=0, task: int = 0) -> tuple[AlfworldState, str]:
        seed_to_int(key_or_seed)  # validated only: the tasks are deterministic
        task = int(task) % self.num_tasks
        gs = self._env(task).reset()
        self._episode += 1
        state = AlfworldState(episode=self._episode, task=task, t=0, done=False, won=False,
                              feedback=gs.feedback.strip(), admissible=tuple(gs["admissible_commands"]),
                              goal=self.problems[task]["goal"])
        self._latest = state
        return state, self.render(state)

    def step(self, state: AlfworldState, action) -> tuple[AlfworldState, str, float, bool, dict]:
        if state is not self._latest:
            raise ValueError("AlfworldPddl.step: stale state (step the latest state of the current episode)")
        info = {"won": int(state.won), "invalid": 0, "truncated": 0}
        if state.done:
            return state, self.render(state), 0.0, True, info
        t = state.t + 1
        truncated = t >= self.max_steps
        if isinstance(action, str):
            command = action.strip()
        else:
            idx = int(action)
            command = state.admissible[idx] if 0 <= idx < len(state.admissible) else None
        if command is None:
            new = replace(state, t=t, done=truncated, feedback=INVALID_MESSAGE)
            info["invalid"] = 1
        else:
            gs, _, _ = self._envs[state.task].step(command)  # a non-admissible command: "Nothing happens."
            won = bool(gs["won"])
            new = AlfworldState(episode=state.episode, task=state.task, t=t, done=won or truncated, won=won,
                                feedback=gs.feedback.strip(), admissible=tuple(gs["admissible_commands"]),
                                goal=state.goal)
            info.update(won=int(won), admissible=int(command in state.admissible))
        info["truncated"] = int(truncated and not new.won)
        reward = 1.0 if new.won else (self.fail_reward if info["truncated"] else 0.0)
        self._latest = new
        return new, self.render(new), reward, new.done, info

    def render(self, state: AlfworldState) -> str:
        return f"{state.feedback}\nActions: {' | '.join(state.admissible)}"

    def close(self) -> None:
        self._envs.clear()
