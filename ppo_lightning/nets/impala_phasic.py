"""The IMPALA CNN actor-critic in Phasic Policy Gradient's layouts (Cobbe et al. 2021).

`PhasicImpalaActorCritic` is `ppo_lightning.nets.impala.ImpalaActorCritic` (its trunk is the policy
encoder; same init and no-autograd fast paths) plus, as in the reference code's
``PhasicValueModel`` (openai/ppo-ewma ``ppg.py``):

- ``arch="dual"`` (PPG's default): a second IMPALA trunk, same shape, feeds the value head;
- ``arch="shared"``: the value head reads the policy trunk (what `ImpalaActorCritic` does);
- ``arch="detach"``: the value head reads the policy trunk through a stop-gradient;
- ``aux_value_head``: a value head on the policy trunk (norm 0.1, like the other heads), read only by
  `forward_aux` in the auxiliary phase.
"""

from __future__ import annotations

from torch import Tensor

from ppo_lightning.nets.impala import ImpalaActorCritic, normed_linear
from ppo_lightning.nets.actor_critic import resolve_arch


class PhasicImpalaActorCritic(ImpalaActorCritic):
    """IMPALA actor-critic with PPG's encoder layouts and auxiliary value head (see the module)."""

    def __init__(
        self,
        observation_space: dict,
        action_space: dict,
        channels: tuple[int, ...] = (16, 32, 32),
        dense: int = 256,
        nblock: int = 2,
        inference_chunk: int = 64,
        arch: str = "dual",
        aux_value_head: bool = True,
    ) -> None:
        super().__init__(observation_space, action_space, channels, dense, nblock, inference_chunk)
        self.arch = resolve_arch(arch)
        self.shared_trunk = self.arch != "dual"
        self.value_encoder = None
        if self.arch == "dual":
            # Only its trunk (stacks + dense) is used: drop its heads so every parameter gets a gradient.
            self.value_encoder = ImpalaActorCritic(observation_space, action_space, channels, dense, nblock,
                                                   inference_chunk)
            self.value_encoder.policy_head = None
            self.value_encoder.value_head = None
        self.aux_value_head = normed_linear(dense, 1, scale=0.1) if aux_value_head else None

    def _value_features(self, obs: Tensor, policy_features: Tensor | None = None) -> Tensor:
        if self.value_encoder is not None:
            return self.value_encoder.features(obs)
        features = self.features(obs) if policy_features is None else policy_features
        return features.detach() if self.arch == "detach" else features

    def _value_head(self, features: Tensor) -> Tensor:
        return self._heads(features, policy=False)[1]

    def value(self, obs: Tensor) -> Tensor:
        """State value, shape ``[..., 1]``."""
        return self._value_head(self._value_features(obs))

    def forward(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        """``(logits, value)``."""
        features = self.features(obs)
        logits = self._heads(features, value=False)[0]
        return logits, self._value_head(self._value_features(obs, features))

    def forward_aux(self, obs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(logits, value, auxiliary value)`` for PPG's auxiliary phase."""
        if self.aux_value_head is None:
            raise ValueError("this network has no auxiliary value head (model.network.aux_value_head)")
        features = self.features(obs)
        logits = self._heads(features, value=False)[0]
        value = self._value_head(self._value_features(obs, features))
        aux = self.aux_value_head(features).float()
        return logits, value, aux
