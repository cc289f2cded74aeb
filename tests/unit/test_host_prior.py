"""The host format prior's states (`crl_jax/backends/llm/host_prior.py`): random walks from the training games'
starts on a scripted two-room game, each state with its own admissible commands, deterministic from the seed;
ragged command tokens packed into padded tables; the prior's id ignores where TextWorld games are compiled."""

import os

import numpy as np

from crl_jax.backends.llm.format_prior import format_prior_id
from crl_jax.backends.llm.host_prior import WALK, _table, collect_states
from crl_jax.config import load


class _Game:
    """Task k: state t shows "task k, turn t" and commands that depend on t; done after 2 steps."""

    def __init__(self):
        self.t, self.closed = 0, False

    @property
    def action_names(self):
        return ("look", f"go {self.t}")

    def reset(self, seed, task):
        self.t, self.task = 0, task
        return 0, f"task {task}, turn 0"

    def step(self, state, action):
        self.t = state + 1
        return self.t, f"task {self.task}, turn {self.t}", 0.0, self.t >= 2, {}

    def close(self):
        self.closed = True


class _Env:
    num_tasks = 3

    def __init__(self):
        self.games = []

    def make(self):
        self.games.append(_Game())
        return self.games[-1]


def test_states_are_walks_from_each_games_start_with_their_own_commands():
    env = _Env()
    states = collect_states(env, 5, seed=0)
    assert WALK >= 2 and env.games[0].closed  # the game is closed after the walk
    # each game: turns 0 and 1 (the state its second step ends in is final: not a state to answer in)
    assert states == [("task 0, turn 0", ("look", "go 0")), ("task 0, turn 1", ("look", "go 1")),
                      ("task 1, turn 0", ("look", "go 0")), ("task 1, turn 1", ("look", "go 1")),
                      ("task 2, turn 0", ("look", "go 0"))]
    assert collect_states(_Env(), 5, seed=0) == states


def test_ragged_token_lists_become_padded_tables():
    tokens, lengths = _table([[[1, 2], [3]], [[4, 5, 6]]], pad=9)
    np.testing.assert_array_equal(tokens, [[[1, 2, 9], [3, 9, 9]], [[4, 5, 6], [9, 9, 9]]])
    np.testing.assert_array_equal(lengths, [[2, 1], [3, 0]])


def test_the_prior_id_ignores_where_textworld_games_are_compiled():
    """The games' cache folder is a location, not the games (the same seeds give the same games): a prior fitted
    with one folder serves a run with another; a parameter of the games themselves changes the id."""
    config = os.path.join(os.path.dirname(__file__), "..", "..", "experiments", "configs", "smollm2_host.yaml")
    ids = [format_prior_id(load(config, ["env.name=textworld", *extra])) for extra in
           ([], ["env.params.cache_dir=/a"], ["env.params.cache_dir=/b"], ["env.params.max_obs_tokens=100"])]
    assert ids[0] == ids[1] == ids[2] != ids[3]
