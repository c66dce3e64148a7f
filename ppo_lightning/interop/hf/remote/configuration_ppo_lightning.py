"""Hugging Face configuration of a ppo_lightning actor-critic (written by ``ppo-lightning export-hf``)."""

from transformers import PretrainedConfig


class PPOLightningConfig(PretrainedConfig):
    """Architecture (``network``) and spaces of the actor-critic, plus training provenance.

    ``observation_space`` / ``action_space`` / ``network`` are the plain dicts that
    ``build_network`` (``networks_ppo_lightning.py``) takes; every other field (``algorithm``,
    ``environment``, ``training``) is informational.
    """

    model_type = "ppo_lightning_actor_critic"

    def __init__(self, network=None, observation_space=None, action_space=None, **kwargs):
        self.network = dict(network or {"name": "mlp"})
        self.observation_space = observation_space
        self.action_space = action_space
        super().__init__(**kwargs)
