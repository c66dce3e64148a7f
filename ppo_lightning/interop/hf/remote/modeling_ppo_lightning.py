"""Hugging Face wrapper of a ppo_lightning actor-critic (written by ``ppo-lightning export-hf``).

The network is built by ``build_network`` of ``networks_ppo_lightning.py`` in this folder: pure
torch, generated at export time from the very definitions that trained it (ppo_lightning need not
be installed). The weights in this folder are the plain network's state dict; this wrapper holds
the network as ``self.network`` (``base_model_prefix``), which transformers loads them into.
"""

import contextlib

import torch
from transformers import PreTrainedModel

from .configuration_ppo_lightning import PPOLightningConfig
from .networks_ppo_lightning import build_network, make_distribution


class PPOLightningActorCritic(PreTrainedModel):
    """Actor-critic trained by ppo_lightning.

    ``forward(observation)`` returns ``(*distribution_parameters, value)`` exactly like the trained
    network (logits for discrete actions; loc and scale for continuous ones); ``distribution``,
    ``value`` and ``act`` are conveniences.
    """

    config_class = PPOLightningConfig
    base_model_prefix = "network"
    main_input_name = "observation"
    _no_split_modules = []

    def __init__(self, config: PPOLightningConfig) -> None:
        super().__init__(config)
        self.network = build_network(config.observation_space, config.action_space, config.network)
        self.post_init()

    def _init_weights(self, module) -> None:
        """Weights come from the checkpoint; the network's own init is kept otherwise."""

    def _compute(self):
        """Low-precision weights: run under autocast (the network feeds float32 observations)."""
        dtype = next(self.network.parameters()).dtype
        if dtype in (torch.bfloat16, torch.float16):
            device = next(self.network.parameters()).device.type
            return torch.autocast(device_type=device, dtype=dtype)
        return contextlib.nullcontext()

    def forward(self, observation: torch.Tensor):
        with self._compute():
            return self.network(observation)

    def policy(self, observation: torch.Tensor):
        with self._compute():
            return self.network.policy(observation)

    def value(self, observation: torch.Tensor) -> torch.Tensor:
        with self._compute():
            return self.network.value(observation)

    def distribution(self, observation: torch.Tensor) -> torch.distributions.Distribution:
        params = [p.float() for p in self.policy(observation)]
        return make_distribution(self.config.action_space, *params)

    @torch.no_grad()
    def act(self, observation: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        dist = self.distribution(observation)
        return dist.mode if deterministic else dist.sample()
