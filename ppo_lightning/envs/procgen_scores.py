"""Normalized return for Procgen: ``(R - R_min) / (R_max - R_min)`` with per-game constants.

The constants are those published with Procgen (Cobbe et al. 2020, appendix) and used by PPG and
PPO-EWMA to report mean normalized return over the 16 games; "hard" constants also serve the other
non-easy modes. A random policy scores about 0, the best known return about 1.
"""

from __future__ import annotations

import math

# game: {mode: (R_min, R_max)}
RETURN_RANGES: dict[str, dict[str, tuple[float, float]]] = {
    "coinrun": {"easy": (5.0, 10.0), "hard": (5.0, 10.0)},
    "starpilot": {"easy": (2.5, 64.0), "hard": (1.5, 35.0)},
    "caveflyer": {"easy": (3.5, 12.0), "hard": (2.0, 13.4)},
    "dodgeball": {"easy": (1.5, 19.0), "hard": (1.5, 19.0)},
    "fruitbot": {"easy": (-1.5, 32.4), "hard": (-0.5, 27.2)},
    "chaser": {"easy": (0.5, 13.0), "hard": (0.5, 14.2)},
    "miner": {"easy": (1.5, 13.0), "hard": (1.5, 20.0)},
    "jumper": {"easy": (1.0, 10.0), "hard": (1.0, 10.0)},
    "leaper": {"easy": (1.5, 10.0), "hard": (1.5, 10.0)},
    "maze": {"easy": (5.0, 10.0), "hard": (4.0, 10.0)},
    "bigfish": {"easy": (1.0, 40.0), "hard": (0.0, 40.0)},
    "heist": {"easy": (3.5, 10.0), "hard": (2.0, 10.0)},
    "climber": {"easy": (2.0, 12.6), "hard": (1.0, 12.6)},
    "plunder": {"easy": (4.5, 30.0), "hard": (3.0, 30.0)},
    "ninja": {"easy": (3.5, 10.0), "hard": (2.0, 10.0)},
    "bossfight": {"easy": (0.5, 13.0), "hard": (0.5, 13.0)},
}


def return_range(game: str, mode: str = "hard") -> tuple[float, float]:
    """(R_min, R_max) of ``game`` in distribution ``mode`` ("easy"; anything else uses "hard")."""
    if game not in RETURN_RANGES:
        raise ValueError(f"no normalized-return constants for Procgen game {game!r}")
    return RETURN_RANGES[game]["easy" if mode == "easy" else "hard"]


def normalized_return(game: str, mode: str, R: float) -> float:
    """``(R - R_min) / (R_max - R_min)``; works elementwise on tensors / arrays too. nan stays nan."""
    r_min, r_max = return_range(game, mode)
    return (R - r_min) / (r_max - r_min)


def mean_normalized_return(returns: dict[str, float], mode: str = "hard") -> float:
    """Mean normalized return over games ``{game: mean raw return}`` (the multi-game summary);
    games without a finite return are skipped; nan if none has one."""
    values = [normalized_return(g, mode, r) for g, r in returns.items() if r is not None and math.isfinite(r)]
    return sum(values) / len(values) if values else float("nan")
