"""The module's optional parts behind one interface: the EWMA proximal policy, PPG's phases, a compiled loss.

`PPOLightningModule` holds a list of `ModulePart` objects and calls each one's hooks in order, with no
branch on which parts a run has: a part that is off is not in the list. The proximal anchor is the
one part always present: the EWMA (`EWMAAnchor`, PPO-EWMA and PPG-EWMA) or the behavior policy
(`BehaviorAnchor`: PPO, decoupled PPO with the behavior as anchor).

The hooks (each a no-op by default):
- ``callbacks()``: Lightning callbacks the part needs (the module's ``configure_callbacks``);
- ``on_fit_start(module)``: after the strategy's setup, in list order (PPG's buffer check, then the
  compiled loss, then the EWMA: the order the module ran them in before they were parts);
- ``teardown()``; ``step_started()`` / ``step_ended() -> metrics`` around each gradient step;
- ``metrics()``: the part's per-iteration metrics (`ppo_lightning.core.members.PerMember` values for
  a seed group's members).
"""

from __future__ import annotations

from typing import Any

from tensordict import TensorDictBase

from ppo_lightning.algos.ppg import PPGPhases, check_phase_buffer_memory
from ppo_lightning.algos.proximal import ProximalEWMAStep, ProximalPolicyEWMA
from ppo_lightning.nets.models import OBS_KEY
from ppo_lightning.nets.recurrent import is_recurrent
from ppo_lightning.training.compiled import CompiledLoss


class ModulePart:
    """An optional part of the module; every hook is a no-op unless the part overrides it."""

    def callbacks(self) -> list:
        return []

    def on_fit_start(self, module) -> None:
        pass

    def teardown(self) -> None:
        pass

    def step_started(self) -> None:
        pass

    def step_ended(self) -> dict[str, float]:
        return {}

    def metrics(self) -> dict[str, Any]:
        return {}


class BehaviorAnchor(ModulePart):
    """The proximal policy is the behavior policy: its distribution parameters come with the batch."""

    source = None

    def proximal_params(self, batch: TensorDictBase, param_keys: list[str]) -> list:
        return [batch.get(k) for k in param_keys]

    def update(self) -> None:
        pass


class EWMAAnchor(ModulePart):
    """The EWMA of the policy's weights as the proximal policy (`ppo_lightning.algos.proximal.ProximalPolicyEWMA`,
    owned by the module and in its checkpoint); `ProximalEWMAStep` says when it moves."""

    def __init__(self, source) -> None:
        self.source = source

    def callbacks(self) -> list:
        return [ProximalEWMAStep()]

    def on_fit_start(self, module) -> None:
        # Under bf16-mixed the proximal forward (in the training step's autocast) may use bf16 weights.
        self.source.bf16 = module.trainer.precision == "bf16-mixed"
        self.source.start(module.network, module.make_network)

    def teardown(self) -> None:
        self.source.stop()

    def proximal_params(self, batch: TensorDictBase, param_keys: list[str]) -> list:
        if is_recurrent(self.source.proximal):  # over the minibatch's segments, from their stored start states
            return self.source.proximal_policy(batch)
        return self.source.proximal_policy(batch.get(OBS_KEY))

    def update(self) -> None:
        self.source.update()

    def metrics(self) -> dict[str, Any]:
        return self.source.metrics()


class PPGPart(ModulePart):
    """PPG's phases (`ppo_lightning.algos.ppg.PPGPhases`): the buffer's memory is checked before the first rollout."""

    def __init__(self, phases) -> None:
        self.phases = phases

    def on_fit_start(self, module) -> None:
        t = module.trainer
        if t.datamodule is not None:
            check_phase_buffer_memory(module.hparams, t.datamodule, processes=max(1, t.world_size // max(1, t.num_nodes)),
                                      state_size=self.phases.state_size)

    def metrics(self) -> dict[str, Any]:
        return self.phases.iteration_metrics()


class CompilePart(ModulePart):
    """``model.compile``: the loss runs a compiled network (`ppo_lightning.training.compiled.CompiledLoss`),
    built at fit start, after configure_model and the strategy's setup, so that (sharded) parameters are final."""

    def __init__(self, value) -> None:
        self.value = value
        self.compiled = None

    def on_fit_start(self, module) -> None:
        if self.compiled is None:
            self.compiled = CompiledLoss(module.loss_module, module.network, self.value)

    def step_started(self) -> None:
        self.compiled.step_started()

    def step_ended(self) -> dict[str, float]:
        return self.compiled.step_ended()


# ----------------------------------------------------------------------------- the module's parts from its settings
def make_anchor(decoupled: bool, com) -> BehaviorAnchor | EWMAAnchor:
    """The EWMA anchor where the objective is decoupled and has a center of mass (a float, or a group's
    per-member ``[S]``), else the behavior policy."""
    if decoupled and com is not None:
        return EWMAAnchor(ProximalPolicyEWMA(com=com))
    return BehaviorAnchor()


def make_phases(ppg: dict | None, action_space, network=None) -> PPGPhases | None:
    """PPG's phase bookkeeping and buffer for a resolved ``model.ppg`` (None: PPO); a recurrent
    ``network``'s phases keep and replay its stored states (`ppo_lightning.algos.ppg.PPGPhases`)."""
    if ppg is None:
        return None
    return PPGPhases(ppg, action_space, state_size=network.state_size if is_recurrent(network) else 0)


def make_ppg_part(phases: PPGPhases | None) -> PPGPart | None:
    return None if phases is None else PPGPart(phases)


def make_compile_part(value) -> CompilePart | None:
    """``model.compile`` (False: off; True or a backend name: on)."""
    return None if value is False else CompilePart(value)
