"""The leaves of a described space and where each sits in the packed vectors.

A space is a plain dict (`ppo_lightning.envs.spaces.describe`): ``box``, ``discrete``, ``multi_discrete``,
``multi_binary`` leaves inside ``dict`` / ``tuple`` parts. The env wrapper packs observations and actions
by these functions and the networks unpack by them (`ppo_lightning.nets.encoders`,
`ppo_lightning.nets.composite`), so both sides read one layout. Standard library only: an exported
network's code carries them.
"""

from __future__ import annotations

import math

LEAF_TYPES = ("box", "discrete", "multi_discrete", "multi_binary")


def space_leaves(space: dict) -> list[dict]:
    """The leaves of a described space, depth first in the order of its parts."""
    kind = space["type"]
    if kind == "dict":
        return [leaf for _, part in space["parts"] for leaf in space_leaves(part)]
    if kind == "tuple":
        return [leaf for part in space["parts"] for leaf in space_leaves(part)]
    return [space]


def raw_size(leaf: dict) -> int:
    """How many numbers a leaf takes in the packed vector."""
    kind = leaf["type"]
    if kind == "box":
        return int(math.prod(leaf["shape"]))
    if kind == "discrete":
        return 1
    if kind == "multi_discrete":
        return len(leaf["nvec"])
    if kind == "multi_binary":
        return int(leaf["n"])
    raise ValueError(f"unknown space type {kind!r} (known: {', '.join(LEAF_TYPES)}, dict, tuple)")


def leaf_layout(space: dict) -> list[tuple[dict, int, int, int, int]]:
    """(leaf, action offset, action size, parameter offset, parameter size) for every leaf."""
    out, a, p = [], 0, 0
    for leaf in space_leaves(space):
        kind = leaf["type"]
        if kind == "discrete":
            a_size, p_size = 1, int(leaf["n"])
        elif kind == "multi_discrete":
            a_size, p_size = len(leaf["nvec"]), sum(int(n) for n in leaf["nvec"])
        elif kind == "multi_binary":
            a_size = p_size = int(leaf["n"])
        elif kind == "box":
            a_size = int(math.prod(leaf["shape"]))
            p_size = 2 * a_size
        else:
            raise ValueError(f"unknown action space type {kind!r}")
        out.append((leaf, a, a_size, p, p_size))
        a, p = a + a_size, p + p_size
    return out
