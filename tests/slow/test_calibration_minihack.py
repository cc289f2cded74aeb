"""Our pure-JAX `room` env against the real MiniHack Room-5x5 family (the reference no one here wrote).

For each variant, a uniform random policy and the scripted explorer (`crl_jax.envs.scripted`, the same
function on both envs: it reads the character view) run N episodes of 30 moves on each env; their
success rates must agree within sampling error: two-proportion |z| < 3.5 (two-sided p ~ 5e-4 per
comparison, ~5e-3 over the 10). N defaults to 300 per (variant, policy, env) to keep CI time bounded;
set CRL_CALIBRATION_EPISODES=1000 to reproduce the README table's precision.
"""

import os

import numpy as np
import pytest

from crl_jax.envs.adapters.calibrate import (
    ROOM_PARAMS,
    run_jax_room,
    run_minihack,
    two_proportion_z,
)

EPISODES = int(os.environ.get("CRL_CALIBRATION_EPISODES", "300"))
Z_MAX = 3.5


def test_two_proportion_z_by_hand():
    # p = 0.5 pooled, se = sqrt(0.25 * (2 / 100)) = 0.0707107; (0.6 - 0.4) / se = 2.8284271
    assert two_proportion_z(60, 100, 40, 100) == pytest.approx(2.8284271, rel=1e-6)
    assert two_proportion_z(0, 10, 0, 10) == 0.0 and two_proportion_z(10, 10, 10, 10) == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(ROOM_PARAMS))
def test_room_matches_real_minihack(variant):
    ours = run_jax_room(variant, EPISODES, seed=1)
    report = []
    for policy in ("random", "explorer"):
        real = run_minihack(variant, policy, EPISODES, seed=0)
        z = two_proportion_z(int(real.sum()), EPISODES, int(ours[policy].sum()), EPISODES)
        report.append(f"{policy}: real {real.mean():.3f} ours {ours[policy].mean():.3f} z {z:+.2f}")
        assert abs(z) < Z_MAX, f"{variant}: " + "; ".join(report)
    # Power check: the comparison is between clearly different policies, on both envs.
    assert np.mean(ours["explorer"]) > np.mean(ours["random"]) + 0.2, report
