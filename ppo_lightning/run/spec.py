"""The run API: a run as a typed value (`RunSpec`) and `train`, which builds and trains it.

    from ppo_lightning.run import Members, RunSpec, train

    spec = RunSpec(configs=["cartpole/ppo"], env="CartPole-v1", seed=0, frames=20_000,
                   model={"lr": 1e-3}, trainer={"precision": "32-true"},
                   members=Members(seeds=[0, 1, 2], settings={"lr": [1e-3, 5e-4, 2e-3]}))
    run = train(spec)
    run.model, run.datamodule, run.trainer, run.exit_code

``fit``, studies and tuning all describe their runs this way. A spec reaches the run builder
(`ppo_lightning.run.builder`, LightningCLI's parser and classes) as values (`RunSpec.values`: its
configs, then its settings), parsed, validated and trained by the same code as a command line, and
every spec has a ``ppo-lightning fit`` line that trains the same run (`RunSpec.argv`, `RunSpec.command`).
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ppo_lightning.core.members import validate_member_values

SECTIONS = ("model", "data", "trainer")
# The fit options a study or a search sets for each of its runs from its own fields (envs, seeds, frames,
# members) and its run folders: its file's ``fit`` may not set them (`ppo_lightning.studies.spec`,
# `ppo_lightning.tuning.space`).
RUNNER_SETTINGS = ("data.env_id", "data.seed", "data.total_frames", "seed_everything", "data.member_seeds",
                   "data.member_hparams", "data.num_seeds", "seeds", "run_dir", "ckpt_path")
CALLBACKS_APPEND = "trainer.callbacks+"


def fit_value(v: Any) -> str:
    """A setting's value as the command line writes it (YAML's true/false/null, JSON for lists and maps)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, (list, tuple, dict)):
        return json.dumps(list(v) if isinstance(v, tuple) else v)
    return str(v)


@dataclass(frozen=True)
class Members:
    """The members of a vectorized group: member k trains on its own envs with seed ``seeds[k]`` and, for
    each name in ``settings`` (the member settings of `ppo_lightning.core.members`), ``settings[name][k]``
    instead of the run's value. One member is a single run."""

    seeds: list[int]
    settings: dict[str, list] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.seeds:
            raise ValueError("members: at least one seed")
        validate_member_values(self.settings, len(self.seeds))


@dataclass(frozen=True)
class RunSpec:
    """One run (or vectorized group): the configs it starts from, then its own settings.

    - ``configs``: shipped config names (``cartpole/ppo``) or YAML paths, merged in order;
    - ``env``, ``seed`` (``seed_everything`` and ``data.seed``), ``frames`` (``data.total_frames``, per member);
    - ``model``, ``data``, ``trainer``: settings of `PPOLightningModule`, `RolloutDataModule` and the
      Trainer, by name (``{"lr": 1e-3}``, nested names dotted: ``{"ppg.n_aux_epochs": 6}``);
    - ``options``: the run's own top-level settings (``scale``, ``scale_rules``, ``run_dir``,
      ``mlflow.experiment``, ``video_every``, ``log_every_frames``, ``checkpoint_every``, ``ckpt_path``);
    - ``members``: seeds and per-member settings of a vectorized group (None: one seed);
    - ``callbacks``: class paths (or a mapping's text: ``{"class_path": ..., "init_args": {...}}``) of
      callbacks the config's callbacks are joined by.
    """

    configs: tuple[str, ...] = ()
    env: str | None = None
    seed: int | None = None
    frames: int | None = None
    model: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    trainer: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    members: Members | None = None
    callbacks: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "configs", tuple(str(c) for c in self.configs))
        object.__setattr__(self, "callbacks", tuple(self.callbacks))
        for key in self.options:
            if key.split(".")[0] in SECTIONS:
                raise ValueError(f"options: {key!r} belongs in the spec's {key.split('.')[0]} settings")

    @classmethod
    def from_settings(cls, configs=(), settings: dict[str, Any] | None = None, **fields) -> RunSpec:
        """A spec from dotted settings as a study's or a search's ``fit:`` writes them (``model.lr``,
        ``trainer.precision``, ``video_every``, ``trainer.callbacks+``), then ``fields``."""
        return cls(configs=tuple(configs), **fields).with_settings(settings or {})

    def with_settings(self, settings: dict[str, Any]) -> RunSpec:
        """A copy with more dotted settings (a later value of a key replaces an earlier one)."""
        sections = {s: dict(getattr(self, s)) for s in SECTIONS}
        options, callbacks = dict(self.options), list(self.callbacks)
        fields: dict[str, Any] = {}
        members = self.members
        for key, value in settings.items():
            head, _, rest = key.partition(".")
            if key == CALLBACKS_APPEND:
                callbacks += value if isinstance(value, (list, tuple)) else [value]
            elif key == "data.env_id":
                fields["env"] = value
            elif key == "data.total_frames":
                fields["frames"] = value
            elif key == "seed_everything":
                fields["seed"] = value
            elif key == "data.seed" and value == fields.get("seed", self.seed):
                pass  # the run's seed seeds its envs unless data.seed says otherwise
            elif key in ("data.member_seeds", "data.member_hparams"):
                seeds = value if key == "data.member_seeds" else (members.seeds if members else None)
                hparams = value if key == "data.member_hparams" else (members.settings if members else {})
                if seeds is None:
                    raise ValueError("data.member_hparams without data.member_seeds")
                members = Members(list(seeds), dict(hparams or {}))
            elif head in SECTIONS and rest:
                sections[head][rest] = value
            else:
                options[key] = value
        return dataclasses.replace(self, **sections, options=options, callbacks=tuple(callbacks),
                                   members=members, **fields)

    def replace(self, **changes) -> RunSpec:
        return dataclasses.replace(self, **changes)

    def settings(self) -> dict[str, Any]:
        """Every setting of the spec but its configs and callbacks as one dotted map, in the order the
        builder reads them."""
        out: dict[str, Any] = dict(self.options)
        for section in SECTIONS:
            out.update({f"{section}.{k}": v for k, v in getattr(self, section).items()})
        if self.env is not None:
            out["data.env_id"] = self.env
        if self.seed is not None:
            out["seed_everything"] = self.seed
            out.setdefault("data.seed", self.seed)
        if self.frames is not None:
            out["data.total_frames"] = self.frames
        if self.members is not None and (len(self.members.seeds) > 1 or self.members.settings):
            out["data.member_seeds"] = list(self.members.seeds)
            if self.members.settings:
                out["data.member_hparams"] = dict(self.members.settings)
        return out

    def argv(self) -> list[str]:
        """The spec as ``fit`` arguments: ``--config`` per config, ``--key value`` per setting."""
        out = [x for c in self.configs for x in ("--config", c)]
        for key, value in self.settings().items():
            out += [f"--{key}={fit_value(value)}"] if key.endswith("+") else [f"--{key}", fit_value(value)]
        return out + [f"--{CALLBACKS_APPEND}={c}" for c in self.callbacks]

    def values(self) -> dict[str, Any]:
        """The spec as the builder takes it as values (`ppo_lightning.run.builder.fit_main`): ``config``,
        the configs merged in order as ``--config`` merges them, then each setting (`settings`) by its
        dotted name, then the callbacks joined. The same run as `argv`'s."""
        out: dict[str, Any] = {"config": list(self.configs), **self.settings()}
        # a callback is a class path or, as on the command line, a mapping's text (class_path, init_args)
        callbacks = [yaml.safe_load(c) if str(c).lstrip().startswith("{") else c for c in self.callbacks]
        if callbacks:
            out[CALLBACKS_APPEND] = callbacks[0] if len(callbacks) == 1 else callbacks
        return out

    def command(self) -> str:
        """The ``ppo-lightning fit`` line that trains this spec."""
        return shlex.join(["ppo-lightning", "fit", *self.argv()])

    def key(self) -> str:
        """A stable text of the spec (group names and resume stamps hash it)."""
        return json.dumps(self.argv())


@dataclass
class Run:
    """A trained (or stopped) run: the Trainer, the model, the data module, and the exit code (0:
    finished; 128 + N: stopped by signal N after a checkpoint, resumable)."""

    trainer: Any
    model: Any
    datamodule: Any
    exit_code: int

    @property
    def run_id(self) -> str | None:
        """The run's MLflow run id (None without tracking)."""
        return getattr(self.trainer.logger, "run_id", None)

    @property
    def run_dir(self) -> Path:
        return Path(self.trainer.default_root_dir)

    @property
    def frames(self) -> float:
        """The frames the run trained (per member), as its data module counts them."""
        return float(self.datamodule.frames)

    @property
    def precision(self) -> str:
        """The precision the run trained in, as Lightning names it (``32-true``, ``bf16-mixed``)."""
        return str(self.trainer.precision)


def train(spec: RunSpec, callbacks=(), ckpt_path: str | Path | None = None) -> Run:
    """Builds and trains ``spec`` in this process (``ckpt_path``: resume from that checkpoint);
    ``callbacks``: callback objects for this run beside the config's. A configuration the builder
    refuses raises ``ValueError`` (or jsonargparse's ``ArgumentError``) before anything trains."""
    from ppo_lightning.run.builder import (
        fit_main,  # start-up cost: Lightning and TorchRL load when a run trains
    )

    extra = {"ckpt_path": str(ckpt_path)} if ckpt_path is not None else {}
    cli = fit_main({"fit": {**spec.values(), **extra}}, extra_callbacks=list(callbacks))
    return Run(cli.trainer, cli.model, cli.datamodule, int(getattr(cli, "exit_code", None) or 0))
