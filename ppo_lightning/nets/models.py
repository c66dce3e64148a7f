"""The network registry: ``model.network.name`` -> the class that builds it.

This module knows every network (the arrows point one way: members import `actor_critic` for the
shared conventions, never this registry), and re-exports those conventions, so that the rest of the
package reads a network's keys and distribution from one place.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ppo_lightning.nets.actor_critic import (  # noqa: F401  (the nets API other layers import)
    OBS_KEY,
    VALUE_KEY,
    ActorCritic,
    dist_param_keys,
    is_sharded,
    make_distribution,
    make_policy_operator,
    make_value_operator,
    resolve_arch,
    shard_network,
)
from ppo_lightning.nets.impala import ImpalaActorCritic
from ppo_lightning.nets.impala_phasic import PhasicImpalaActorCritic
from ppo_lightning.nets.minatar_cnn import MinAtarActorCritic
from ppo_lightning.nets.spaces_net import SpacesActorCritic, needs_spaces_network
from ppo_lightning.nets.recurrent import RecurrentActorCritic
from ppo_lightning.nets.pixel_cnn import NatureActorCritic, SmallActorCritic, resolve_network

NETWORK_NAMES = ("auto", "mlp", "impala_cnn", "minatar_cnn", "nature_cnn", "small_cnn")

def build_network(observation_space: dict, action_space: dict, network: dict[str, Any]) -> nn.Module:
    """Build the actor-critic named by ``network["name"]`` (`NETWORK_NAMES`; ``auto``: the one
    `ppo_lightning.nets.pixel_cnn.choose_network` picks for the observation space); with a ``core``
    (lstm, gru), that network's encoder followed by the core
    (`ppo_lightning.nets.recurrent.RecurrentActorCritic`)."""
    network = dict(resolve_network(observation_space, network)[0])
    name = network.pop("name", "mlp")
    if "precision" in network:  # deprecated (0.1): the Trainer's precision applies to every network
        network.pop("precision")
    if network.get("core") is not None:  # an LSTM or GRU core after the named network's encoder (nets.recurrent)
        return RecurrentActorCritic(observation_space, action_space, encoder=name, **network)
    network.pop("core", None), network.pop("core_size", None)
    if network.pop("post_core_sizes", None):
        raise ValueError("model.network.post_core_sizes: layers after a recurrent core, which needs model.network.core "
                         "(lstm or gru)")
    if name == "mlp":
        if needs_spaces_network(observation_space, action_space):  # any other gymnasium space, action masks
            return SpacesActorCritic(observation_space, action_space, **network)
        return ActorCritic(observation_space, action_space, **network)
    if name == "impala_cnn":
        if "arch" in network or "aux_value_head" in network:  # PPG's layouts (ppo_lightning.nets.impala_phasic)
            return PhasicImpalaActorCritic(observation_space, action_space, **network)
        return ImpalaActorCritic(observation_space, action_space, **network)
    if name == "minatar_cnn":  # the MinAtar paper's conv(16, 3x3) + dense 128
        return MinAtarActorCritic(observation_space, action_space, **network)
    if name == "nature_cnn":  # the DQN paper's CNN (Atari; images of 36x36 and more)
        return NatureActorCritic(observation_space, action_space, **network)
    if name == "small_cnn":  # smaller images
        return SmallActorCritic(observation_space, action_space, **network)
    raise ValueError(f"model.network.name must be one of {', '.join(NETWORK_NAMES)}, got {name!r}")
