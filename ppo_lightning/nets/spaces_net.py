"""The MLP actor-critic over any gymnasium space: per-part observation encoders, composite actions, masks.

`SpacesActorCritic` is `ppo_lightning.nets.actor_critic.ActorCritic` (the same bodies, heads, init and
layouts) with the packed observation read by `ppo_lightning.nets.encoders.ObservationEncoder` (each leaf
through its registered encoder, the features joined) and the policy's parameters written for the action
space: a ``Discrete`` action's logits, a ``Box`` action's mean and scale, or a composite action's one
parameter tensor (`ppo_lightning.nets.composite`). Where the observation carries an action mask, the
logits of illegal actions are `ppo_lightning.nets.composite.MASKED_LOGIT` in every call (collection,
the loss's current, behavior and proximal policies alike, evaluation, an exported folder): the mask is
part of the observation, so each policy reads the same one.

`ppo_lightning.nets.models.build_network` builds it for ``model.network.name: mlp`` where the env
needs it (`needs_spaces_network`); plain ``Box`` / ``Discrete`` envs keep `ActorCritic`.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ppo_lightning.nets.actor_critic import ActorCritic
from ppo_lightning.envs.space_layout import leaf_layout
from ppo_lightning.nets.composite import categorical_groups, head_sizes, policy_params
from ppo_lightning.nets.encoders import ObservationEncoder


def needs_spaces_network(observation_space: dict, action_space: dict) -> bool:
    """Whether the spaces need `SpacesActorCritic`: a described (packed) observation, an action mask
    or a composite action."""
    return bool(observation_space.get("space") or observation_space.get("action_mask")
                or action_space.get("type") == "composite")


class SpacesActorCritic(ActorCritic):
    """`ActorCritic` over a packed observation and any action space (module docstring)."""

    def __init__(self, observation_space: dict, action_space: dict, hidden_sizes: tuple[int, ...] = (64, 64),
                 activation: str = "tanh", shared_trunk: bool = False, arch: str | None = None,
                 aux_value_head: bool = False, normalize_observation: bool = False) -> None:
        encoder = ObservationEncoder(observation_space)
        if normalize_observation and (observation_space.get("space") is not None or encoder.mask_size):
            kind = (observation_space.get("space") or {}).get("type", "box")
            raise ValueError("model.network.normalize_observation normalizes Box observations without an action mask; "
                             f"this env's observations are {kind}{' with a mask' if encoder.mask_size else ''} "
                             "(normalize them in a gymnasium wrapper of your env)")
        kind = action_space["type"]
        if kind == "composite":
            heads, stds = head_sizes(action_space["space"])
            head_space = {"type": "discrete", "n": heads}
        else:
            head_space, stds = action_space, 0
        super().__init__({"shape": [encoder.out_dim]}, head_space, hidden_sizes, activation, shared_trunk, arch,
                         aux_value_head, normalize_observation)
        self.action_space = action_space
        self.encoder = encoder
        self.composite = kind == "composite"
        self.discrete = kind == "discrete"
        if self.composite:
            self.log_std = nn.Parameter(torch.zeros(stds)) if stds else None
        self.mask_size = encoder.mask_size
        if self.mask_size:
            logits = self._categorical_logits(action_space)
            if logits != self.mask_size:
                raise ValueError(f"the env's action mask has {self.mask_size} entries, its action space "
                                 f"{logits} categorical choices (Discrete: n, MultiDiscrete: sum of nvec)")

    @staticmethod
    def _categorical_logits(action_space: dict) -> int:
        if action_space["type"] == "discrete":
            return int(action_space["n"])
        if action_space["type"] == "composite":
            return sum(sum(categorical_groups(leaf)) for leaf, *_ in leaf_layout(action_space["space"]))
        return 0

    def _encode(self, obs: Tensor) -> tuple[Tensor, Tensor | None]:
        features, mask = self.encoder(obs)
        if self.obs_norm is not None:
            features = self.obs_norm(features)
        return features, mask

    def _params(self, features: Tensor, mask: Tensor | None) -> tuple[Tensor, ...]:
        # float32 under any autocast (the loss's ratios)
        return policy_params(self.action_space, self.policy_head(features).float(), self.log_std, mask)

    def policy(self, obs: Tensor) -> tuple[Tensor, ...]:
        x, mask = self._encode(obs)
        return self._params(self.policy_body(x), mask)

    def value(self, obs: Tensor) -> Tensor:
        x, _ = self._encode(obs)
        return self.value_head(self._value_features(x)).float()

    def forward(self, obs: Tensor) -> tuple[Tensor, ...]:
        x, mask = self._encode(obs)
        features = self.policy_body(x)
        return (*self._params(features, mask), self.value_head(self._value_features(x, features)).float())

    def forward_aux(self, obs: Tensor) -> tuple[Tensor, ...]:
        if self.aux_value_head is None:
            raise ValueError("this network has no auxiliary value head (model.network.aux_value_head)")
        x, mask = self._encode(obs)
        features = self.policy_body(x)
        value = self.value_head(self._value_features(x, features)).float()
        return (*self._params(features, mask), value, self.aux_value_head(features).float())

