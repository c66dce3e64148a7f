"""Everything that shapes the future of a run, beyond weights and optimizer, for an exact resume.

A checkpoint written at the end of iteration k and resumed must continue *bitwise* as the run that
was never interrupted. Besides what Lightning and the callbacks save (network, optimizer, EWMA,
adaptive beta, normalizers, staleness queue, episode windows), that needs, on every data-parallel rank:

- the random number generators used for action sampling (torch's global one; numpy's and Python's
  for good measure; CUDA's when present);
- the environments' own state: each gymnasium sub-env's wrapper chain as plain data (`env_state`),
  Procgen's through ``get_state``/``set_state`` (`ProcgenTorchEnv.get_state`);
- the collector's carried step (current observation, done flags, step counts, episode-return
  accumulators; a recurrent network's state of every env and whether its next step starts an
  episode): TorchRL's ``Collector`` keeps it as ``_carrier``, and so do this package's loops;
- any state a new algorithm registers (`register`), e.g. PPG's phase buffer.

All of it is encoded as tensors, numbers, strings, lists and dicts, so checkpoints still load with
``torch.load(weights_only=True)``. Under data parallelism every rank's state is gathered into the
checkpoint (rank 0 writes it) and each rank restores its own entry.

MuJoCo envs are restored too: their ``MjData`` as ``mj_getState``'s integration state (`_mujoco_state`),
their model and renderer rebuilt. An env whose state is not plain data (a Box2D world, an env in
another process) cannot be restored: the resume then warns once and the environments restart, as the
whole run did before (episodes in progress are lost). `env_state` reports such attributes by name.
"""

from __future__ import annotations

import copy
import enum
import io
import random
import types
import warnings
from typing import Any, Protocol

import numpy as np
import torch

from ppo_lightning.adapters.torchrl import carried_step, gym_env
from ppo_lightning.core.errors import CheckpointError

# ---------------------------------------------------------------------------- plain encoding


class NotRestorable(Exception):
    """A value with no plain encoding (its env cannot be restored exactly)."""


_PLAIN = (bool, int, float, str, type(None))


def encode(value: Any) -> Any:
    """A plain, ``weights_only``-loadable encoding of numbers, strings, numpy arrays (numbers, bytes or
    text) / scalars / generators, and lists, tuples and str- or int-keyed dicts of those. Raises `NotRestorable` otherwise."""
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            raise NotRestorable("object array")
        if value.dtype.kind in "SU":  # bytes or text (FrozenLake's map): the characters, and the dtype
            return {"__strarray__": {"text": np.char.decode(value, "latin-1").tolist() if value.dtype.kind == "S"
                                     else value.tolist(), "dtype": value.dtype.str}}
        return {"__ndarray__": torch.from_numpy(np.ascontiguousarray(value).copy())}
    if isinstance(value, np.generic):
        return {"__npscalar__": torch.from_numpy(np.asarray(value).copy())}
    if isinstance(value, np.random.Generator):
        return {"__generator__": encode(value.bit_generator.state)}
    if isinstance(value, np.random.RandomState):
        return {"__randomstate__": encode(value.get_state(legacy=False))}
    if isinstance(value, (list, tuple)):
        items = [encode(v) for v in value]
        return {"__tuple__": items} if isinstance(value, tuple) else items
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        if any(k.startswith("__") and k.endswith("__") for k in value):
            raise NotRestorable("dict with reserved keys")
        return {k: encode(v) for k, v in value.items()}
    if isinstance(value, dict) and all(isinstance(k, int) and not isinstance(k, bool) for k in value):
        return {"__intdict__": [[k, encode(v)] for k, v in value.items()]}  # e.g. FrozenLake's transition table
    if isinstance(value, torch.Tensor):
        return {"__tensor__": value.detach().cpu().clone()}
    raise NotRestorable(type(value).__name__)


def _bit_generator(state: dict) -> np.random.BitGenerator:
    bit_gen = getattr(np.random, state["bit_generator"])()
    bit_gen.state = state
    return bit_gen


def decode(value: Any) -> Any:
    if isinstance(value, list):
        return [decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    if "__ndarray__" in value:
        return value["__ndarray__"].numpy().copy()
    if "__intdict__" in value:
        return {int(k): decode(v) for k, v in value["__intdict__"]}
    if "__strarray__" in value:
        saved = value["__strarray__"]
        text = np.array(saved["text"], dtype=str)
        return np.char.encode(text, "latin-1").astype(saved["dtype"]) if "S" in saved["dtype"] else text.astype(saved["dtype"])
    if "__npscalar__" in value:
        return value["__npscalar__"].numpy()[()]
    if "__generator__" in value:
        return np.random.Generator(_bit_generator(decode(value["__generator__"])))
    if "__randomstate__" in value:
        rs = np.random.RandomState()
        rs.set_state(decode(value["__randomstate__"]))
        return rs
    if "__tuple__" in value:
        return tuple(decode(v) for v in value["__tuple__"])
    if "__tensor__" in value:
        return value["__tensor__"].clone()
    return {k: decode(v) for k, v in value.items()}


# ---------------------------------------------------------------------------- RNGs


def rng_state() -> dict[str, Any]:
    state = {
        "torch": torch.get_rng_state(),
        "numpy": encode(np.random.get_state(legacy=False)),
        "python": encode(random.getstate()),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(decode(state["numpy"]))
    random.setstate(decode(state["python"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---------------------------------------------------------------------------- gymnasium env state

# Attributes that are structure, not state (rebuilt identically from the config).
_SKIP_KEYS = {"env", "envs", "env_fns", "_saved_kwargs", "spec", "_cached_spec", "metadata", "_metadata",
              "render_mode", "_action_space", "_observation_space", "action_space", "observation_space",
              "single_action_space", "single_observation_space", "autoreset_mode", "_env_obs"}


def _is_structure(value: Any) -> bool:
    import gymnasium as gym

    return isinstance(value, (gym.Space, gym.envs.registration.EnvSpec, gym.Env, gym.vector.VectorEnv, enum.Enum,
                               types.ModuleType, type)) or callable(value)


def _mujoco_kind(value: Any) -> str | None:
    """``"data"`` for MuJoCo's ``MjData`` (the simulation's state), ``"static"`` for what a MuJoCo env
    rebuilds or only draws with (``MjModel``, from the env's XML; gymnasium's ``MujocoRenderer``), else None."""
    kind = type(value)
    if kind.__module__.startswith("mujoco") and kind.__name__ == "MjData":
        return "data"
    if (kind.__module__.startswith("mujoco") and kind.__name__ == "MjModel") or kind.__name__ == "MujocoRenderer":
        return "static"
    return None


def _mujoco_state(env: Any, data: Any) -> dict[str, Any]:
    """``mj_getState``'s integration state (time, qpos, qvel, act, the solver's warm start, controls,
    applied forces, mocap, user data): what ``mj_step`` continues from bitwise. The derived quantities
    (positions, contact forces) are recomputed by the next step, so none is saved."""
    import mujoco  # optional: only for a MuJoCo env's state

    spec = mujoco.mjtState.mjSTATE_INTEGRATION
    buf = np.empty(mujoco.mj_stateSize(env.model, spec), dtype=np.float64)
    mujoco.mj_getState(env.model, data, buf, spec)
    return {"__mjdata__": encode(buf)}


def _set_mujoco_state(env: Any, data: Any, saved: dict[str, Any]) -> None:
    import mujoco  # optional: only for a MuJoCo env's state

    spec = mujoco.mjtState.mjSTATE_INTEGRATION
    buf = decode(saved["__mjdata__"])
    if buf.shape != (mujoco.mj_stateSize(env.model, spec),):
        raise CheckpointError(f"the checkpoint's MuJoCo state has {buf.shape[0]} numbers, this model's "
                              f"{mujoco.mj_stateSize(env.model, spec)}: resume with the same env id")
    mujoco.mj_setState(env.model, data, np.ascontiguousarray(buf, dtype=np.float64), spec)


def _object_state(obj: Any) -> tuple[dict[str, Any], list[str]]:
    state, missing = {}, []
    for key, value in vars(obj).items():
        if key in _SKIP_KEYS or _is_structure(value):
            continue
        mj = _mujoco_kind(value)
        if mj == "static":
            continue
        if mj == "data":
            state[key] = _mujoco_state(obj, value)
            continue
        try:
            state[key] = encode(value)
        except NotRestorable as err:
            missing.append(f"{type(obj).__name__}.{key} ({err})")
    return state, missing


def _layers(env: Any) -> list[Any]:
    layers = [env]
    while hasattr(layers[-1], "env") and layers[-1].env is not layers[-1]:
        layers.append(layers[-1].env)
    return layers


def gym_vector_state(vec: Any) -> dict[str, Any]:
    """State of a gymnasium ``SyncVectorEnv``: its own buffers and every sub-env's wrapper chain.

    ``restorable`` is False (and ``missing`` names the attributes) when some state is not plain data.
    """
    own, missing = _object_state(vec)
    subs = []
    for sub in vec.envs:
        layers = []
        for layer in _layers(sub):
            s, m = _object_state(layer)
            layers.append(s)
            missing += m
        subs.append(layers)
    return {"vector": own, "envs": subs, "restorable": not missing, "missing": missing[:8]}


def set_gym_vector_state(vec: Any, state: dict[str, Any]) -> None:
    def apply(obj, saved):
        for key, value in saved.items():
            current = getattr(obj, key, None)
            if isinstance(value, dict) and "__mjdata__" in value:  # MuJoCo's simulation state, in place
                _set_mujoco_state(obj, current, value)
            elif isinstance(current, np.random.Generator) and isinstance(value, dict) and "__generator__" in value:
                current.bit_generator.state = decode(value["__generator__"])
            else:
                setattr(obj, key, decode(value))

    if len(state["envs"]) != len(vec.envs):
        raise CheckpointError(f"the checkpoint has {len(state['envs'])} environments per rank, the config "
                              f"{len(vec.envs)} (data.num_envs): resume with the same data.num_envs")
    apply(vec, state["vector"])
    for sub, layers in zip(vec.envs, state["envs"]):
        for layer, saved in zip(_layers(sub), layers):
            apply(layer, saved)


# ---------------------------------------------------------------------------- the rollout source


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def _base_env(env: Any) -> Any:
    return getattr(env, "base_env", env)


def env_state(env: Any) -> dict[str, Any]:
    """State of a TorchRL env built by `ppo_lightning.envs.make_env` (gymnasium, Procgen or MinAtar)."""
    base = _base_env(env)
    if hasattr(base, "get_raw_state"):  # MinAtarTorchEnv: plain Python / numpy state, encoded here
        try:
            return {"kind": "raw", "state": encode(base.get_raw_state()), "restorable": True, "missing": []}
        except NotRestorable as err:
            return {"kind": "raw", "restorable": False, "missing": [f"{type(base).__name__} ({err})"]}
    if hasattr(base, "get_state"):  # ProcgenTorchEnv
        return {"kind": "procgen", "state": base.get_state(), "restorable": True, "missing": []}
    vec = gym_env(base)  # the gymnasium env inside TorchRL's GymWrapper
    if vec is None or not hasattr(vec, "envs"):
        return {"kind": "unknown", "restorable": False, "missing": [type(base).__name__]}
    return {"kind": "gymnasium", **gym_vector_state(vec)}


def set_env_state(env: Any, state: dict[str, Any]) -> None:
    base = _base_env(env)
    if state["kind"] == "raw":
        try:
            base.set_raw_state(decode(state["state"]))
        except ValueError as err:
            raise CheckpointError(str(err)) from None
    elif state["kind"] == "procgen":
        base.set_state(state["state"])
    else:
        set_gym_vector_state(gym_env(base), state)


def collector_state(collector: Any) -> dict[str, Any]:
    """The step the collector carries to its next rollout (observation, done flags, step counts,
    episode-return accumulators, a recurrent network's states and ``is_init``):
    `ppo_lightning.adapters.torchrl.carried_step`."""
    carrier = carried_step(collector)
    if carrier is None:
        raise RuntimeError("torchrl's Collector has no _carrier: exact resume needs updating for this torchrl version")
    return {"carrier": carrier.to_dict(), "batch_size": list(carrier.batch_size)}


def set_collector_state(collector: Any, state: dict[str, Any]) -> None:
    from tensordict import TensorDict

    carried_step(collector).update(TensorDict(state["carrier"], batch_size=state["batch_size"]))


def capture(source: Any, providers: dict[str, Stateful], pending: dict[str, Any] | None = None) -> dict[str, Any]:
    """This rank's resume state: the RNGs, each provider's state, and the `RolloutSource`'s own (envs
    and carried steps); while no source exists, those of ``pending`` (a restored state not applied yet)."""
    out: dict[str, Any] = {"rng": rng_state(), "extra": {k: v.state_dict() for k, v in providers.items()}}
    if source is not None:
        out.update(source.resume_state())
    elif pending is not None:
        out.update({k: v for k, v in pending.items() if k != "extra"})
    return out


_warned: set[str] = set()


def apply(source: Any, providers: dict[str, Stateful], state: dict[str, Any]) -> None:
    """Restore ``state`` (from `capture`) once the `RolloutSource` exists: providers, then envs and
    collector through the source, then the RNGs (last, so that building the source consumed nothing
    of the restored streams)."""
    for key, provider in providers.items():
        if key in state.get("extra", {}):
            provider.load_state_dict(state["extra"][key])
    source.load_resume_state(state)
    set_rng_state(state["rng"])


def set_source_env_state(source: Any, state: dict[str, Any]) -> None:
    """A single run's env and collector state (`capture`'s "env" and "collector"), where it has one."""
    env, env_id = state.get("env"), source.config.env_id
    if env is None:
        return
    if env["restorable"]:
        set_env_state(source.env, env)
        set_collector_state(source.collector, state["collector"])
    elif env_id not in _warned:
        _warned.add(env_id)
        warnings.warn(
            f"resume: the state of {env_id!r} cannot be restored exactly (not plain data: "
            f"{', '.join(env['missing']) or 'unknown env'}); the environments restart, so the resumed run "
            f"differs from an uninterrupted one", stacklevel=2)


# ---------------------------------------------------------------------------- data-parallel ranks


def world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def gather_rank_states(local: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rank's ``local`` state, in rank order (a collective: all ranks must call it)."""
    rank, size = world()
    if size == 1:
        return [local]
    # Through torch.save bytes: all_gather_object's own pickling of tensors does not round-trip
    # every tensor (torch 2.13), and this also proves each rank's state loads with weights_only.
    buf = io.BytesIO()
    torch.save(local, buf)
    blobs: list[Any] = [None] * size
    torch.distributed.all_gather_object(blobs, buf.getvalue())
    return [torch.load(io.BytesIO(b), weights_only=True) for b in blobs]


def select_rank_state(states: list[dict[str, Any]], rank: int, elastic: dict[str, int] | None = None) -> dict[str, Any]:
    """This rank's entry. ``elastic`` (``{"saved_num_envs", "num_envs"}``, set by a ``--rescale`` resume,
    `ppo_lightning.training.rescale`): a rank beyond the saved ones takes rank 0's shared state (normalizer
    statistics, shuffling, RNG streams) with new environments; a rank whose ``num_envs`` changed
    keeps its statistics with new environments; PPG's phase buffer is left out (a new phase starts)."""
    if elastic is not None:
        new_rank = rank >= len(states)
        state = copy.copy(states[0] if new_rank else states[rank])
        resume = dict(state.get("resume") or {})
        resume["extra"] = {k: v for k, v in (resume.get("extra") or {}).items() if k != "ppg_buffer"}
        if new_rank or elastic["num_envs"] != elastic["saved_num_envs"]:
            for key in [k for k in resume if k not in ("rng", "extra")]:  # the source's envs and carried steps
                resume.pop(key)
            if state.get("reward_normalizer") is not None:
                state["reward_normalizer"] = {**state["reward_normalizer"],
                                              "ret": torch.zeros(elastic["num_envs"], dtype=torch.float64)}
        if new_rank:
            state["episodes"] = {"returns": [], "lengths": [], "count": 0}
        state["resume"] = resume
        return state
    if rank >= len(states):
        raise CheckpointError(f"the checkpoint holds the state of {len(states)} data-parallel rank(s); this is rank "
                              f"{rank}: resume with the same number of devices")
    return states[rank]
