"""Observations of any gymnasium space as one flat vector, and the per-part encoders that read it.

A space is described by a plain dict (JSON- and weights_only-safe), written by
`ppo_lightning.envs.spaces.describe` from the gymnasium space:

- ``{"type": "box", "shape": [...], "dtype": "float32"}``: values, flattened;
- ``{"type": "discrete", "n": n}``: one index in ``[0, n)`` (gymnasium's ``start`` removed by the env wrapper);
- ``{"type": "multi_discrete", "nvec": [n_1, ..., n_k]}``: k indices, each in ``[0, n_i)``;
- ``{"type": "multi_binary", "n": n}``: n bits;
- ``{"type": "dict", "parts": [[name, space], ...]}`` and ``{"type": "tuple", "parts": [space, ...]}``,
  nested to any depth.

The env wrapper (`ppo_lightning.envs.spaces.SpacesWrapper`) packs an observation into one float32 vector,
its leaves in order, each leaf's raw values (`raw_size` numbers); an action mask, where the env has one,
goes last. The network's `ObservationEncoder` splits the vector into its leaves, runs each through the
encoder registered for its type (`ENCODERS`: one-hot for ``discrete``, one-hot per part for
``multi_discrete``, values for ``box`` and ``multi_binary``) and joins the features. `register_encoder`
replaces one or adds one (a class built from the leaf's description, with an ``out_dim`` attribute).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ppo_lightning.envs.space_layout import LEAF_TYPES, raw_size, space_leaves




def one_hot(index: Tensor, n: int) -> Tensor:
    """``index`` (float or integer, ``[...]``) as one-hot float ``[..., n]`` (comparison, so ``vmap`` runs it)."""
    return (index.long().unsqueeze(-1) == torch.arange(n, device=index.device)).float()


class ValuesEncoder(nn.Module):
    """A ``box`` or ``multi_binary`` leaf: its values as they are."""

    def __init__(self, leaf: dict) -> None:
        super().__init__()
        self.out_dim = raw_size(leaf)

    def forward(self, x: Tensor) -> Tensor:
        return x


class OneHotEncoder(nn.Module):
    """A ``discrete`` leaf: its index one-hot (``n`` features)."""

    def __init__(self, leaf: dict) -> None:
        super().__init__()
        self.n = int(leaf["n"])
        self.out_dim = self.n

    def forward(self, x: Tensor) -> Tensor:
        return one_hot(x[..., 0], self.n)


class MultiOneHotEncoder(nn.Module):
    """A ``multi_discrete`` leaf: each index one-hot, joined (``sum(nvec)`` features)."""

    def __init__(self, leaf: dict) -> None:
        super().__init__()
        self.nvec = [int(n) for n in leaf["nvec"]]
        self.out_dim = sum(self.nvec)

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([one_hot(x[..., i], n) for i, n in enumerate(self.nvec)], dim=-1)


# leaf type -> encoder class (built from the leaf's description; ``out_dim``: its feature count)
ENCODERS = {"box": ValuesEncoder, "multi_binary": ValuesEncoder, "discrete": OneHotEncoder,
            "multi_discrete": MultiOneHotEncoder}


def register_encoder(leaf_type: str, cls) -> None:
    """Encode every leaf of ``leaf_type`` (one of `LEAF_TYPES`) with ``cls``: ``cls(leaf)`` is an
    ``nn.Module`` with an ``out_dim`` attribute whose forward maps the leaf's packed values
    ``[..., raw_size(leaf)]`` to features ``[..., out_dim]``. Networks built after the call use it."""
    if leaf_type not in LEAF_TYPES:
        raise ValueError(f"register_encoder: leaf type must be one of {LEAF_TYPES}, got {leaf_type!r}")
    ENCODERS[leaf_type] = cls


class ObservationEncoder(nn.Module):
    """The packed observation ``[..., size]`` -> (features ``[..., out_dim]``, action mask or None).

    ``observation_space``: the network's observation dict (``{"shape": [size], "dtype": "float32",
    "space": <description>, "action_mask": m}``, the last two optional: without ``space`` the observation
    is a plain ``Box``, flattened). The mask, when there is one, is the vector's last ``m`` numbers."""

    def __init__(self, observation_space: dict) -> None:
        super().__init__()
        self.mask_size = int(observation_space.get("action_mask") or 0)
        space = observation_space.get("space")
        self.obs_ndim = len(observation_space["shape"])
        if space is None:  # a plain Box: flattened values
            self.sizes = [int(math.prod(observation_space["shape"])) - self.mask_size]
            self.parts = nn.ModuleList([ValuesEncoder({"type": "box", "shape": [self.sizes[0]]})])
        else:
            leaves = space_leaves(space)
            self.sizes = [raw_size(leaf) for leaf in leaves]
            self.parts = nn.ModuleList([ENCODERS[leaf["type"]](leaf) for leaf in leaves])
        self.out_dim = sum(int(part.out_dim) for part in self.parts)

    def forward(self, obs: Tensor) -> tuple[Tensor, Tensor | None]:
        obs = obs.float()
        if self.obs_ndim > 1:
            obs = obs.flatten(-self.obs_ndim)
        features, start = [], 0
        for size, part in zip(self.sizes, self.parts):
            features.append(part(obs[..., start:start + size]))
            start += size
        mask = obs[..., start:start + self.mask_size] > 0.5 if self.mask_size else None
        out = features[0] if len(features) == 1 else torch.cat(features, dim=-1)
        return out, mask
