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

    A recurrent network (``config.network["core"]``: ``lstm`` or ``gru``; ``recurrent`` is True)
    carries a state of ``state_size`` numbers per env, and every method takes it and returns the
    next one: ``forward(observation, state=None, is_init=None)`` returns ``(*distribution_parameters,
    value, new_state)`` (the trained network's ``step``); ``policy``, ``distribution``, ``value`` and
    ``act`` return ``(their output, new_state)``. ``state`` ``[*batch, state_size]``: zeros
    (``initial_state(*batch)``) before an episode's first step, then the state the previous call
    returned; ``is_init`` ``[*batch]`` bool: True where an episode starts at this step (the state is
    zeroed there before the step). ``state=None`` starts every episode of the batch (zeros);
    ``is_init=None`` with a state given means no episode starts.
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

    # ------------------------------------------------------------------ recurrent state
    @property
    def recurrent(self) -> bool:
        """Whether the network has an LSTM or GRU core (then every method takes and returns the state)."""
        return bool(getattr(self.network, "recurrent", False))

    @property
    def state_size(self) -> int:
        """The numbers of one env's recurrent state (0 for a feed-forward network)."""
        return int(self.network.state_size) if self.recurrent else 0

    def initial_state(self, *batch_shape: int, device=None) -> torch.Tensor:
        """Zeros ``[*batch_shape, state_size]`` (float32): the state before an episode's first step."""
        if not self.recurrent:
            raise ValueError("this policy is feed-forward: it has no recurrent state")
        return self.network.initial_state(*batch_shape, device=device or next(self.network.parameters()).device)

    def _state_inputs(self, observation: torch.Tensor, state, is_init):
        """(state, is_init) for the network's ``step``; None for a feed-forward network."""
        if not self.recurrent:
            if state is not None or is_init is not None:
                raise ValueError("this policy is feed-forward: it takes no state or is_init")
            return None
        batch = observation.shape[: observation.dim() - self.network.obs_ndim]
        if state is None:  # every episode of the batch starts here
            return self.initial_state(*batch, device=observation.device), torch.ones(batch, dtype=torch.bool,
                                                                                     device=observation.device)
        if is_init is None:
            is_init = torch.zeros(batch, dtype=torch.bool, device=observation.device)
        return state.to(observation.device, torch.float32), torch.as_tensor(is_init, device=observation.device).bool()

    def step(self, observation: torch.Tensor, state=None, is_init=None):
        """One step of a recurrent network: ``(*distribution_parameters, value, new_state)``."""
        inputs = self._state_inputs(observation, state, is_init)
        if inputs is None:
            raise ValueError("this policy is feed-forward: call it without a state")
        with self._compute():
            *out, new_state = self.network.step(observation, *inputs)
        return (*out, new_state.float())

    # ------------------------------------------------------------------ the policy
    def forward(self, observation: torch.Tensor, state=None, is_init=None):
        if self.recurrent:
            return self.step(observation, state, is_init)
        self._state_inputs(observation, state, is_init)  # refuses a state
        with self._compute():
            return self.network(observation)

    def policy(self, observation: torch.Tensor, state=None, is_init=None):
        if self.recurrent:
            *params, _value, new_state = self.step(observation, state, is_init)
            return tuple(params), new_state
        self._state_inputs(observation, state, is_init)
        with self._compute():
            return self.network.policy(observation)

    def value(self, observation: torch.Tensor, state=None, is_init=None):
        if self.recurrent:
            *_params, value, new_state = self.step(observation, state, is_init)
            return value, new_state
        self._state_inputs(observation, state, is_init)
        with self._compute():
            return self.network.value(observation)

    def distribution(self, observation: torch.Tensor, state=None, is_init=None):
        if self.recurrent:
            params, new_state = self.policy(observation, state, is_init)
            return make_distribution(self.config.action_space, *[p.float() for p in params]), new_state
        params = [p.float() for p in self.policy(observation, state, is_init)]
        return make_distribution(self.config.action_space, *params)

    @torch.no_grad()
    def act(self, observation: torch.Tensor, deterministic: bool = False, *, state=None, is_init=None):
        """An action (the mode if ``deterministic``, else a sample); ``(action, new_state)`` for a
        recurrent network (``act(obs, state=state, is_init=is_init)``)."""
        if self.recurrent:
            dist, new_state = self.distribution(observation, state, is_init)
            return (dist.mode if deterministic else dist.sample()), new_state
        dist = self.distribution(observation, state, is_init)
        return dist.mode if deterministic else dist.sample()
