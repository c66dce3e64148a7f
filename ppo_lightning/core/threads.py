"""Thread settings that avoid oversubscription on small machines.

Torch's intra-op pool defaults to one thread per core; Procgen runs its own worker threads, and
small MLPs gain nothing from parallel kernels but pay their synchronisation on every call (measured
on CartPole: see the README). The automatic choice: 1 thread for gymnasium (MLP) envs; for Procgen
all cores, its env stepping being cheap next to the CNN. Override with ``data.num_threads``.
"""

from __future__ import annotations

import torch

from ppo_lightning.core.hardware import core_count


def auto_threads(env_id: str) -> int:
    if env_id.startswith("procgen:"):
        return max(1, core_count())
    return 1


def configure_threads(num_threads: int | None, env_id: str) -> int:
    """Set torch's intra-op threads (explicit value, else `auto_threads`); returns the number."""
    n = num_threads if num_threads is not None else auto_threads(env_id)
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n
