"""Normalized return for MinAtar: ``(R - R_random) / (R_ref - R_random)`` with per-game constants.

MinAtar has no published normalization constants, so both are measured by this project
with MinAtar's defaults (sticky actions 0.1, difficulty ramping, all 6 actions):

* ``R_random``: mean episode return of a uniform random policy, 300 episodes per game (32 envs,
  seed 12345): ``python experiments/minatar_random.py`` ->
  ``experiments/results/minatar/random_returns.csv``.
* ``R_ref``: the project's own longer PPO run per game: ppo_lightning/configs/minatar/ppo.yaml (MinAtar CNN,
  64 envs x 64 steps, 8 minibatches x 3 epochs, Adam 5e-4, reward normalization), 303,104 frames
  (74 iterations; 3x the experiments' 100k-frame runs), one seed (1000, disjoint from the
  experiments' seeds); R_ref = the mean over the last 10% of its frames of the mean return of the
  last 20 episodes:
  ``ppo-lightning study run experiments/studies/minatar_reference_100k.yaml`` (records:
  ``experiments/results/minatar/reference_runs.csv``).

So 0 = random play and 1 = what PPO at the base configuration reaches in 300k frames; longer or
better runs exceed 1. One seed makes R_ref itself noisy: it scales every arm of a game alike, so
comparisons between arms are unaffected in sign, only in units.

Games the experiments leave out of the pooled statistics (uninformative at their 100k-frame runs):

* Asterix: PPO is barely above random in 300k frames (R_ref - R_random = 0.31 points, less than the
  sd of one episode's return): normalizing by it multiplies noise by ~3.
* Seaquest: likewise (R_ref - R_random = 0.87 points after 300k frames).
* Freeway: an episode lasts 2,500 frames per env, so with the base configuration's 64 envs the first
  episodes end after 160k frames: a 100k-frame run has no finished episode, hence no learning
  curve (R_ref 18.85 after 303k frames; fewer envs or longer runs would make it informative).

A 1M+-frame reference on all five games is the first thing to run with more CPU: a copy of
``experiments/studies/minatar_reference_100k.yaml`` with ``frames: 1000000`` and ``seeds: {count: 2}``.
"""

from __future__ import annotations

import math

# game: (R_random, R_ref)
RETURN_RANGES: dict[str, tuple[float, float]] = {
    "asterix": (0.4567, 0.7625),  # PPO barely above random at this budget: uninformative (see module doc)
    "breakout": (0.4767, 4.825),
    "freeway": (0.1267, 18.85),  # no finished episode within a 100k-frame run at 64 envs (see module doc)
    "seaquest": (0.0967, 0.9688),  # PPO barely above random at this budget: uninformative
    "space_invaders": (2.5033, 22.0437),
}


# game: R_ref of the 500k base (``score: minatar-500k``): the mean final return of its longest reference
# runs (arm ``ppo_ewma_lr8x`` of ``experiments/results/minatar/reference_runs.csv``, 1M+ frames; study file
# ``experiments/studies/minatar_reference_500k.yaml``). Shipped with the package so that a study file
# anywhere scores the same; `tests/test_minatar.py` recomputes them from the CSV.
REFERENCE_500K: dict[str, float] = {
    "asterix": 10.866,
    "breakout": 14.1714,
    "seaquest": 6.426,
    "space_invaders": 109.1653,
}


def return_range(game: str) -> tuple[float, float]:
    """(R_random, R_ref) of a MinAtar game."""
    if game not in RETURN_RANGES:
        raise ValueError(f"no normalized-return constants for MinAtar game {game!r}; games: {', '.join(RETURN_RANGES)}")
    r_random, r_ref = RETURN_RANGES[game]
    if not math.isfinite(r_ref):
        raise ValueError(f"no R_ref measured for MinAtar game {game!r} (no reference run at this project's budget: "
                         "ppo-lightning study run experiments/studies/minatar_reference_100k.yaml)")
    return r_random, r_ref


def normalized_return(game: str, R: float) -> float:
    """``(R - R_random) / (R_ref - R_random)``; works elementwise on arrays; nan stays nan."""
    r_random, r_ref = return_range(game)
    return (R - r_random) / (r_ref - r_random)


def mean_normalized_return(returns: dict[str, float]) -> float:
    """Mean normalized return over games ``{game: mean raw return}``; non-finite returns skipped."""
    values = [normalized_return(g, r) for g, r in returns.items() if r is not None and math.isfinite(r)]
    return sum(values) / len(values) if values else float("nan")
