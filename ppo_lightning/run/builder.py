"""The run builder: LightningCLI's parser and classes with our defaults (`PPOCLI`), and `fit_main`,
which builds and trains one run from ``fit`` arguments (a command line) or values
(``{"fit": RunSpec.values()}``). The ``fit`` command (`ppo_lightning.cli.fit`) and the run API
(`ppo_lightning.run.spec.train`) both come here, so a command line and a `RunSpec` are validated and
trained by the same code.

The YAML has the usual LightningCLI sections: ``trainer`` (pl.Trainer), ``model``
(`PPOLightningModule`, or a subclass: ``--model my_pkg.MyModule`` / ``model.class_path``, whose
checkpoints resume as that class), ``data`` (`RolloutDataModule`), plus ``mlflow``,
``checkpoint_every`` and ``run_dir``. The data module supplies the observation and action spaces to
the model.
"""

from __future__ import annotations

import copy
import logging
import math
import os
import sys
import warnings
from pathlib import Path

import jsonargparse
from lightning.pytorch.callbacks import Callback, ProgressBar
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import CSVLogger

from ppo_lightning.adapters.lightning import subcommand_parsers
from ppo_lightning.training.callbacks import (
    MANAGED_CALLBACKS,
    FramesProgressBar,
    IterationCheckpoint,
    TrackingState,
    TrainingVideo,
    quiet_library_notices,
    record_run_setup,
    wait_for_episodes,
)
from ppo_lightning.data.datamodule import RolloutDataModule
from ppo_lightning.training.module import PPOLightningModule
from ppo_lightning.training.precision import PPOTrainer, planned_processes, resolve_auto, take_precision_aliases
from ppo_lightning.training import rescale
from ppo_lightning.training.tracking import (DEFAULT_TRACKING_URI, RunCSVLogger, SafeMLFlowLogger, make_logger, run_loggers,
                                             view_hints)
from ppo_lightning.algos import scaling
from ppo_lightning.training.preemption import Preemption, SignalStop
from ppo_lightning.training.update import check_micro_batch_size, one_clip_setting
from ppo_lightning.core.configs import checked_config, plain, resolve_config_args
from ppo_lightning.training.diagnostics import SmallBatchDiagnostics
from ppo_lightning.training import preemption
from ppo_lightning.interop import run_folder
from ppo_lightning.interop.checkpoint_io import check_checkpoint_file
from ppo_lightning.training.checkpointing import AtomicCheckpointIO
from ppo_lightning.training.storage_faults import preflight
from ppo_lightning.training.mlflow_sender import SPOOL_NAME
from ppo_lightning.core.safety import refuse_symlink
from ppo_lightning.run import trust
from ppo_lightning.run import resume as resume_cli
from ppo_lightning.run.resume import MODEL_CLASS_PATH, fill_data_seed, model_config


class SaveRunConfig(SaveConfigCallback):
    """Write the resolved config into the run folder (MLflow's logger has no local log_dir) and
    attach it to the MLflow run. ``model.network`` is the one the model built (``name: auto`` resolved
    to the chosen network, `ppo_lightning.nets.pixel_cnn.resolve_network`)."""

    def save_config(self, trainer, pl_module, stage: str) -> None:
        run_dir = Path(trainer.default_root_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / self.config_filename
        refuse_symlink(path, "the run's config")  # a planted link: its target is never overwritten
        network = getattr(pl_module, "hparams", {}).get("network")
        if network is not None and "model" in self.config:  # the network the model built (``auto`` resolved)
            model_config(self.config)["network"] = copy.deepcopy(dict(network))
        self.parser.save(self.config, str(path), skip_none=False, overwrite=True)
        if isinstance(trainer.logger, SafeMLFlowLogger):
            trainer.logger.log_file(path)


_TRAINING_STARTED = False  # errors after this point are not configuration errors


class _TrainingStarted(Callback):
    """Marks the end of configuration: the library's own checks (staleness against the objective,
    PPG's phase buffer against memory: in the data module and the model) run before ``on_train_start``."""

    def on_train_start(self, trainer, pl_module) -> None:
        global _TRAINING_STARTED
        _TRAINING_STARTED = True


def _is_progress_bar(class_path: str) -> bool:
    import importlib

    module, _, name = str(class_path).rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return False
    return isinstance(cls, type) and issubclass(cls, ProgressBar)


def _logger_entry(logger: SafeMLFlowLogger) -> dict:
    return {"experiment_name": logger.experiment_name, "tracking_uri": logger.tracking_uri}


# Lightning's seed_everything logs "Seed set to N" here, before the CLI's checks run.
SEED_LOGGER = "lightning.fabric.utilities.seed"


class HeldLogLines(logging.Filter):
    """Holds a logger's records from construction until `release` (emitted then) or `drop`."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.logger, self.held = logging.getLogger(name), []
        self.logger.addFilter(self)

    def filter(self, record: logging.LogRecord) -> bool:
        self.held.append(record)
        return False

    def release(self) -> None:
        self.logger.removeFilter(self)
        for record in self.held:
            self.logger.handle(record)
        self.held = []

    def drop(self) -> None:
        self.logger.removeFilter(self)
        self.held = []


def nested_entries(values: dict, cfg) -> dict:
    """``values`` with each entry of a dict-valued setting (``model.init_args.network.hidden: 16``,
    ``data.env_kwargs.x: 1``) set in that setting's dict as the configs left it (``model.init_args.network:
    {..., hidden: 16}``), as ``--model.network.hidden 16`` sets it on the command line. A setting whose
    value is not a dict is left to the parser."""
    out, entries = {}, {}
    for key, value in values.items():
        depth = 3 if key.startswith("model.init_args.") else 2 if key.startswith("data.") else 0
        parts = key.split(".")
        if depth and len(parts) > depth:
            entries.setdefault(".".join(parts[:depth]), []).append((parts[depth:], value))
        else:
            out[key] = value
    for head, items in entries.items():
        current = out.get(head, cfg.get(head) if head.rsplit(".", 1)[0] in cfg else None)
        root = plain(current) if current is not None else {}
        if not isinstance(root, dict):
            out.update({f"{head}.{'.'.join(path)}": value for path, value in items})
            continue
        for path, value in items:
            node = root
            for part in path[:-1]:
                node = node.setdefault(part, {}) if isinstance(node.get(part), dict) or part not in node else node[part]
            node[path[-1]] = value
        out[head] = root
    return out


class PPOCLI(LightningCLI):
    """LightningCLI with our defaults: MLflow tracking, a frames progress bar, periodic checkpoints.

    ``extra_callbacks``: callback objects for this run in addition to the config's (benchmarks and
    experiments that read results from a callback they hold, e.g. a frames-to-threshold recorder)."""

    def __init__(self, *args, extra_callbacks=(), **kwargs) -> None:
        self.extra_callbacks = list(extra_callbacks)
        self._seed_line = HeldLogLines(SEED_LOGGER)  # an error in the checks is the first line a user sees
        try:
            super().__init__(*args, **kwargs)
        finally:
            self._seed_line.drop()

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        return {"fit": {"model", "train_dataloaders", "val_dataloaders", "datamodule"}}

    def add_arguments_to_parser(self, parser) -> None:
        # `--model my_pkg.MyModule` (or `model: {class_path: ..., init_args: ...}`) picks a subclass;
        # without one, `model:` / `--model.X` configure PPOLightningModule as before.
        parser.set_defaults({"model": {"class_path": MODEL_CLASS_PATH}})
        parser.link_arguments("data.observation_space", "model.init_args.observation_space", apply_on="instantiate")
        parser.link_arguments("data.action_space", "model.init_args.action_space", apply_on="instantiate")
        parser.link_arguments("data.seeds", "model.init_args.seeds", apply_on="instantiate")  # vectorized seeds
        parser.link_arguments("data.member_hparams", "model.init_args.member_hparams", apply_on="instantiate")
        parser.add_argument("--seeds", type=int | None, default=None,
                            help="train this many seeds in one process, vectorized (sets data.num_seeds)")
        parser.add_argument("--mlflow.enabled", type=bool, default=True, help="track the run in MLflow")
        parser.add_argument("--mlflow.tracking_uri", type=str, default=DEFAULT_TRACKING_URI)
        parser.add_argument("--mlflow.experiment", type=str, default="ppo-lightning")
        parser.add_argument("--mlflow.run_name", type=str | None, default=None)
        parser.add_argument("--checkpoint_every", type=int, default=50, help="save a .ckpt every N iterations")
        parser.add_argument("--log_every_frames", type=int, default=0,
                            help="send metrics to the loggers at most once per N frames (per seed) and at the last "
                                 "iteration; 0: every iteration. For small batches (an iteration of a few frames)")
        parser.add_argument("--run_dir", type=str | None, default=None, help="default: runs/<experiment>/<time>")
        parser.add_argument("--video_every", type=int | None, default=0,
                            help="record an MP4 every N iterations and at the end, into run_dir/videos and MLflow "
                                 "(0: one at the end of fit, when MLflow is on; null: never)")
        # Batch-size invariance (ppo_lightning.algos.scaling): divide both batch sizes by c, scale the rest.
        parser.add_argument("--scale", type=float | None, default=None, help="divide both batch sizes by c (<1: multiply)")
        parser.add_argument("--scale_rules", type=str, default="all", help="comma list of lr,com,adv_span,ppg_n_pi; all; none")
        parser.add_argument("--scale_adam_betas", type=bool, default=False, help="with --scale: betas ** (1/c)")
        parser.add_argument("--trust_code", type=bool, default=False,
                            help="with --ckpt_path: allow the class paths and objective paths the checkpoint names "
                                 "to be imported (also --trust-code); only for checkpoints you trust")
        parser.add_argument("--resume_override", type=str | None, default=None,
                            help="with --ckpt_path: comma list of settings (model.x,data.y) whose command-line value "
                                 "replaces the checkpoint's (ppo_lightning.run.resume)")
        parser.add_argument("--rescale", type=bool, default=False,
                            help="with --ckpt_path on another world size or data.num_envs: apply the batch-size "
                                 "scaling rules (--scale_rules, --scale_adam_betas) for the batch's factor")

    def before_instantiate_classes(self) -> None:
        cfg = self.config[self.subcommand]
        fill_data_seed(cfg)
        if cfg.get("seeds") is not None:  # --seeds S is data.num_seeds
            cfg.data.num_seeds = cfg.seeds
        if cfg.checkpoint_every <= 0:
            raise ValueError(f"checkpoint_every must be a positive integer, got {cfg.checkpoint_every}")
        if cfg.log_every_frames < 0:
            raise ValueError(f"log_every_frames must be >= 0 (0: every iteration), got {cfg.log_every_frames}")
        self.scale_params = None
        if cfg.get("scale") is not None:
            rules = scaling.parse_rules(cfg.scale_rules, cfg.scale_adam_betas)
            report = scaling.apply_scale(cfg, cfg.scale, rules)
            print(scaling.format_scale_table(cfg.scale, rules, report), flush=True)
            self.scale_params = scaling.scale_params(cfg.scale, rules, report)
            if cfg.get("ckpt_path"):  # the scaled settings must be the checkpoint's
                rescale.check_resumed_scaled_settings(cfg.ckpt_path, model_config(cfg), cfg.scale)
        # a recurrent network's micro-batches are whole segments of L steps
        check_micro_batch_size(model_config(cfg).get("micro_batch_size"), scaling.recurrent_sequence_length(cfg))
        strategy = cfg.trainer.get("strategy")
        if str(getattr(strategy, "class_path", "")) == "lightning.pytorch.strategies.ModelParallelStrategy":
            # sharded checkpoints written to a temporary folder and swapped in (never half-written)
            strategy.class_path = "ppo_lightning.training.sharded.AtomicModelParallelStrategy"
        if model_config(cfg).get("ppg") is not None and strategy == "ddp":
            # PPG's steps leave parameters unused (the auxiliary value head in policy steps)
            cfg.trainer.strategy = "ddp_find_unused_parameters_true"
        resolve_config_precision(cfg)

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except ValueError as err:  # jsonargparse wraps the model's own one-line error (class path mode)
            root = err
            while isinstance(root.__cause__ or root.__context__, ValueError):
                root = root.__cause__ or root.__context__
            if root is err:
                raise
            raise root from None

    def instantiate_trainer(self, **kwargs):
        cfg = self.config[self.subcommand]
        # Resuming (--ckpt_path) continues the checkpoint's MLflow run and run folder, unless
        # --mlflow.run_name asks for a new run.
        resumed = run_folder.read_tracking_state(cfg.ckpt_path) if cfg.get("ckpt_path") and not cfg.mlflow.run_name else {}
        resumed = run_folder.own_tracking_state(cfg.ckpt_path, resumed) if resumed else resumed  # in place only
        run_name = preemption.run_name(cfg.mlflow.run_name)
        run_dir = run_folder.run_folder(trust.run_root_dir(cfg), cfg.mlflow.experiment, run_name, resumed.get("run_dir"))
        self.run_dir = run_dir
        if resumed.get("run_dir"):  # the same folder on purpose: its checkpoints are this run's
            warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
        # Callbacks and logger this CLI manages are rebuilt from the top-level options on every run
        # (a saved config.yaml lists them; loading it again must not duplicate them or reuse the
        # old run's folder and MLflow run).
        given = self.config_init[self.subcommand].trainer
        user_callbacks = [c for c in (given.get("callbacks") or []) if not isinstance(c, MANAGED_CALLBACKS)]
        given["callbacks"] = user_callbacks
        logger = given.get("logger")
        checkpoints = run_dir / "checkpoints" if cfg.trainer.get("enable_checkpointing") is not False else None
        mlflow_store = cfg.mlflow.tracking_uri if cfg.mlflow.enabled and logger is not False else None
        run_folder.check_run_folder(run_dir)  # planted symbolic links: one line, exit code 2, nothing created
        preflight(run_dir, checkpoints, mlflow_store)  # unwritable folders: one line, exit code 4
        if logger is not False:  # MLflow's logger, then --trainer.logger's; metrics.csv without either
            mlflow_logger = (make_logger(cfg.mlflow.tracking_uri, cfg.mlflow.experiment, run_name,
                                         run_id=resumed.get("mlflow_run_id"), spool=run_dir / "checkpoints" / SPOOL_NAME)
                             if cfg.mlflow.enabled else None)
            kwargs["logger"] = run_loggers(mlflow_logger, logger, run_dir)
        kwargs.setdefault("default_root_dir", str(run_dir))
        if not cfg.trainer.get("plugins"):  # atomic checkpoint writes, one-line errors on unreadable files
            kwargs["plugins"] = [AtomicCheckpointIO()]
        has_bar = any(isinstance(c, ProgressBar) for c in user_callbacks)
        callbacks = self.managed_callbacks(cfg, run_dir, user_has_progress_bar=has_bar)
        self.checkpoint_callback = next((c for c in callbacks if isinstance(c, IterationCheckpoint)), None) \
            or self.managed_checkpoint(cfg, run_dir)

        # SIGTERM / SIGINT / SLURM's requeue signal: checkpoint at the iteration's end, exit 128 + signal
        stopper = Preemption if cfg.trainer.get("enable_checkpointing") is not False else SignalStop
        callbacks = callbacks + [stopper(str(run_dir / "checkpoints"))] + self.extra_callbacks
        self.trainer_defaults = {**self.trainer_defaults, "callbacks": callbacks}
        final = kwargs.get("logger") or []
        record_run_setup(cfg, callbacks, next((_logger_entry(lg) for lg in final if isinstance(lg, SafeMLFlowLogger)), None),
                         next((lg.save_dir for lg in final if isinstance(lg, RunCSVLogger)), None))
        kwargs["precision"] = self.resolve_run_precision(cfg)
        trainer = super().instantiate_trainer(**kwargs)
        self._seed_line.release()  # every check passed: "Seed set to N" as Lightning would have said it
        return trainer

    def resolve_run_precision(self, cfg) -> str:
        """``trainer.precision`` for this run's network and data (``auto``: measured on a CPU,
        `ppo_lightning.training.precision.resolve_auto`), written into the config (config.yaml) and
        kept with its reason for the run's params (`before_fit`)."""
        processes = planned_processes(cfg.trainer.get("devices", "auto"), cfg.trainer.get("num_nodes", 1))
        choice, reason = resolve_auto(cfg.trainer.get("precision"), cfg.trainer.get("accelerator", "auto"),
                                      self.model, self.datamodule, processes)
        cfg.trainer.precision = choice
        self.precision_params = {"precision": str(choice if choice is not None else "32-true"), "precision_reason": reason}
        return choice

    @staticmethod
    def managed_checkpoint(cfg, run_dir: Path) -> IterationCheckpoint:
        return IterationCheckpoint(
            dirpath=str(run_dir / "checkpoints"),
            filename="iteration-{iteration:05d}",
            auto_insert_metric_name=False,
            every_n_epochs=cfg.checkpoint_every,
            save_top_k=-1,
            save_last=True,
            save_on_train_epoch_end=True,
        )

    def managed_callbacks(self, cfg, run_dir: Path, user_has_progress_bar: bool) -> list:
        """The callbacks built from this CLI's options (see `ppo_lightning.training.callbacks.MANAGED_CALLBACKS`)."""
        callbacks: list = []
        # a progress bar of the user's (trainer.callbacks) replaces ours; first, so that it closes
        # before the end-of-fit video is recorded
        if cfg.trainer.get("enable_progress_bar") is not False and not user_has_progress_bar:
            callbacks.append(FramesProgressBar())
        callbacks.append(TrackingState(str(run_dir)))
        # the default (0) is the end-of-fit video for the MLflow run; none when nothing would show it
        if cfg.get("video_every") is not None and (cfg.video_every != 0 or cfg.mlflow.enabled):
            callbacks.append(TrainingVideo(str(run_dir), every=cfg.video_every))
        if cfg.trainer.get("enable_checkpointing") is not False:
            callbacks.append(self.managed_checkpoint(cfg, run_dir))
        return callbacks

    def _parse_ckpt_path(self) -> None:
        """LightningCLI puts a checkpoint's model hyperparameters over the config's here; around it, the
        resume rules (`ppo_lightning.run.resume.before_checkpoint_settings` / `after_checkpoint_settings`:
        code the checkpoint names, ``--scale``'s c = 1 values, the checkpoint's settings against the
        command line's)."""
        sub = self.config.get("subcommand")
        cfg = self.config[sub] if sub else None
        if cfg is not None:  # here (LightningCLI parses the checkpoint path first, for every command): before
            move_ppg_gradient_clip(cfg)  # a checkpoint's settings are compared with the command line's
        pending = resume_cli.before_checkpoint_settings(cfg) if cfg is not None and cfg.get("ckpt_path") else None
        super()._parse_ckpt_path()
        if pending is not None:
            resume_cli.after_checkpoint_settings(self.config[sub], pending, self._argv, self._dotted)

    def parse_arguments(self, parser, args) -> None:
        """``--print_config`` prints the config with the callbacks and logger the run would use
        (built from the options as `instantiate_trainer` does, without creating anything). A
        ``--ckpt_path`` is checked first: LightningCLI reads the checkpoint's hyperparameters right
        after parsing, so an incomplete file is refused here, in one line (ppo_lightning.training.checkpointing)."""
        if isinstance(args, dict):  # `fit_main`'s values (`ppo_lightning.run.spec.RunSpec.values`)
            return self._parse_values(parser, args)
        argv = list(sys.argv[1:] if args is None else args)
        self._argv = argv  # the settings given (`ppo_lightning.run.resume.explicit_settings`)
        # --model.objective_args.eps_high 0.3: one entry of a dict setting
        argv, self._dotted = resume_cli.split_dotted(argv)
        args = argv = resume_cli.with_checkpoint_class(argv)  # a subclass's checkpoint: its settings parse
        flags = [a for a in argv if a == "--print_config" or a.startswith("--print_config=")]
        if not flags:
            self._parse_one_line(parser, args)
            self._check_checkpoint()
            return
        self._parse_one_line(parser, [a for a in argv if a not in flags])
        sub = self.config["subcommand"]
        cfg = self.config[sub]
        fill_data_seed(cfg)
        run_dir = run_folder.run_folder(cfg.run_dir, cfg.mlflow.experiment, cfg.mlflow.run_name or "<time>")
        user_has_bar = any(_is_progress_bar(getattr(c, "class_path", "")) for c in cfg.trainer.get("callbacks") or [])
        logger = cfg.trainer.get("logger")
        entry = None
        if cfg.mlflow.enabled and logger is not False:
            entry = {"experiment_name": cfg.mlflow.experiment, "tracking_uri": cfg.mlflow.tracking_uri}
        csv_dir = str(run_dir) if not cfg.mlflow.enabled and logger in (None, True) else None  # as `run_loggers`
        record_run_setup(cfg, self.managed_callbacks(cfg, run_dir, user_has_bar), entry, csv_dir)
        import yaml

        full = yaml.safe_load(parser.dump(self.config, skip_none=False, skip_check=True))
        sys.stdout.write(yaml.safe_dump(full[sub], sort_keys=False))
        sys.exit(0)

    def _check_checkpoint(self) -> None:
        sub = self.config.get("subcommand")
        if sub == "fit" and not self.config[sub].get("ckpt_path"):
            self.config[sub].ckpt_path = self._slurm_resume_checkpoint(self.config[sub])
        ckpt_path = self.config[sub].get("ckpt_path") if sub else None
        if ckpt_path:
            check_checkpoint_file(ckpt_path)

    def _parse_values(self, parser, args: dict) -> None:
        """Parse ``{subcommand: {"config": [paths], dotted setting: value, ...}}`` as the command line
        ``<subcommand> --config path ... --setting value ...`` parses: the configs merged in order by
        the subcommand's parser (`jsonargparse.ActionConfigFile`), the settings over them as values (a
        class given by the checkpoint, `ppo_lightning.run.resume.checkpoint_class`, under them), the
        dotted entries of dict settings applied after. The resume checks read the settings' names."""
        [(sub, given)] = args.items()
        given = dict(given)
        configs = given.pop("config", None) or []
        self._argv = [f"--{key}" for key in given]  # the settings given, by name
        values, self._dotted = resume_cli.split_dotted_values(given)
        cls = None if "model.class_path" in given else resume_cli.checkpoint_class(given.get("ckpt_path"))
        # the model is a class path and its init arguments: ``model.X`` is ``model.init_args.X`` (as
        # ``--model.X v`` parses), after the checkpoint's class where one is taken (``--model <class>``)
        values = {**({"model.class_path": cls} if cls is not None else {}), **{
            f"model.init_args.{k[len('model.'):]}" if k.startswith("model.") and k != "model.class_path"
            and not k.startswith("model.init_args.") else k: v for k, v in values.items()}}
        [sub_parser] = subcommand_parsers(parser)  # fit's (`subcommands`)

        def parse() -> None:
            for key, value in values.items():  # as the parser refuses the text nan or inf for a number
                if isinstance(value, float) and not math.isfinite(value):
                    raise jsonargparse.ArgumentError(None, f'Parser key "{key}":\n  Expected a finite number. Got value: {value}')
            cfg = jsonargparse.Namespace()
            for path in configs:
                jsonargparse.ActionConfigFile.apply_config(sub_parser, cfg, "config", str(path))
            cfg = sub_parser.parse_object(nested_entries(values, cfg), namespace=cfg)
            self.config = parser.parse_object({"subcommand": sub, sub: cfg})

        self._parse_one_line(parser, parse, config_model_class=given.get("model.class_path") or cls)
        self._check_checkpoint()

    def _parse_one_line(self, parser, args, config_model_class: str | None = None) -> None:
        """Parse; a setting its class does not take (a misspelled ``--model.X`` of a subclass, ``--data.X``)
        is one line naming the class and the closest setting (`ppo_lightning.run.resume.unknown_setting`);
        other parse errors print as jsonargparse prints them. Then the dotted dict entries are applied."""
        parsers = [parser, *subcommand_parsers(parser)]
        saved = [p.exit_on_error for p in parsers]
        for p in parsers:
            p.exit_on_error = False
        try:
            args() if callable(args) else super().parse_arguments(parser, args)
        except jsonargparse.ArgumentError as err:
            message = resume_cli.unknown_setting(self._argv if callable(args) else args, config_model_class) \
                if callable(args) or isinstance(args, list) else None
            if message:
                raise ValueError(message) from None
            for p, flag in zip(parsers, saved):
                p.exit_on_error = flag
            parser.error(str(err))
        finally:
            for p, flag in zip(parsers, saved):
                p.exit_on_error = flag
        sub = self.config.get("subcommand")
        if self._dotted and sub:
            resume_cli.apply_dotted(model_config(self.config[sub]), self._dotted)

    @staticmethod
    def _slurm_resume_checkpoint(cfg) -> str | None:
        """A requeued SLURM job resumes by itself from its run folder's newest checkpoint
        (`ppo_lightning.interop.run_folder.find_resume_checkpoint`)."""
        name = preemption.slurm_run_name()
        if name is None:
            return None
        found = run_folder.find_resume_checkpoint(run_folder.run_folder(cfg.run_dir, cfg.mlflow.experiment, cfg.mlflow.run_name or name))
        if found is not None:
            restart = os.environ.get("SLURM_RESTART_COUNT")
            print(f"SLURM job {name[len('slurm-'):]}{f' (restart {restart})' if restart else ''}: resuming from {found}",
                  file=sys.stderr, flush=True)
        return None if found is None else str(found)

    def before_fit(self) -> None:
        cfg = self.config[self.subcommand]
        if cfg.get("ckpt_path"):  # another world size / num_envs: --rescale applies the scaling rules, else refused
            world = self.trainer.num_nodes * self.trainer.num_devices
            rules = scaling.parse_rules(cfg.scale_rules, cfg.scale_adam_betas)
            self.trainer.callbacks.append(rescale.ElasticResume(rescale.plan(cfg.ckpt_path, world, self.datamodule, cfg.rescale, rules)))
        elif cfg.get("rescale"):
            raise ValueError("--rescale applies to a resumed run: give --ckpt_path")
        self.trainer.callbacks.append(_TrainingStarted())  # errors before it are configuration errors
        self.model.log_every_frames = cfg.get("log_every_frames") or 0

        # clip fraction, advantage-std warnings; the warm-up in frames, so c times the iterations at --scale c
        self.trainer.callbacks.append(SmallBatchDiagnostics(scale=self.config[self.subcommand].get("scale") or 1.0))
        wait_for_episodes(self.trainer.callbacks)  # episode/... monitors wait for the first episode
        for logger in self.trainer.loggers:
            if getattr(self, "scale_params", None):
                logger.log_hyperparams(self.scale_params)
            if getattr(self, "precision_params", None):  # what ran, and why
                logger.log_hyperparams(self.precision_params)

    def after_fit(self) -> None:
        trainer, dm = self.trainer, self.datamodule

        self.exit_code = preemption.finish(trainer, trainer.logger)  # stopped by a signal: its line, 128 + n
        if self.exit_code is not None or not trainer.is_global_zero:
            return
        ckpt = self.checkpoint_callback.last_model_path or "(none)"
        ranks = trainer.world_size > 1
        group = dm.states if dm.members > 1 else None  # vectorized seeds: every seed's return
        returns = (", ".join(f"{st.episodes.mean_return(20):.1f}" for st in group) + (f" (members' seeds {dm.seeds})" if getattr(dm, "member_seeds", None) else f" (seeds {dm.seeds[0]}..{dm.seeds[-1]})")
                   if group else f"{dm.states[0].episodes.mean_return(20):.1f}")
        print(
            f"\nfinished: {dm.frames} frames{' (all ranks)' if ranks else ''}{' per seed' if group else ''}, "
            f"{dm.iteration} iterations, mean return of the last 20 episodes {returns}"
            + (f" (rank 0 of {trainer.world_size})" if ranks else "")
        )
        print(f"checkpoint: {ckpt}")
        videos = [p for cb in trainer.callbacks if isinstance(cb, TrainingVideo) for p in cb.paths]
        if videos:
            print(f"video: {videos[-1]}")
        if self.checkpoint_callback.last_model_path:
            pick = " --seed_index 0" if group else ""  # a group's checkpoint holds every seed: name one
            print(f"  score it with: ppo-lightning evaluate {ckpt}{pick} --episodes 10 --video agent.mp4")
        for csv_logger in (lg for lg in trainer.loggers if isinstance(lg, CSVLogger)):  # ours, or --trainer.logger's
            print(f"metrics: {(Path(csv_logger.log_dir) / 'metrics.csv').resolve()}")
        logger = trainer.logger
        run_id = getattr(logger, "run_id", None)
        if isinstance(logger, SafeMLFlowLogger) and not logger.failed:
            continued = " (continued)" if logger.resumed else ""
            print(f"mlflow run: {run_id}{continued} in {logger.tracking_uri} (experiment {logger.experiment_name})")
            for line in view_hints(logger.tracking_uri, logger.experiment_id, run_id):
                print(line)


def move_ppg_gradient_clip(cfg) -> None:
    """``trainer.gradient_clip_val`` is the one gradient-clipping setting, for PPO and PPG alike. PPG
    steps its optimizers itself (manual optimization, whose gradients Lightning refuses to clip), so
    for a PPG model the value moves into ``model.ppg.max_grad_norm``, the norm its manual step clips
    to (per member in a group, as PPO's), and the Trainer gets none. Set both and different, or with
    ``gradient_clip_algorithm: value``: one line."""
    ppg, clip = model_config(cfg).get("ppg"), cfg.trainer.get("gradient_clip_val")
    if ppg is None or not clip:
        return
    if cfg.trainer.get("gradient_clip_algorithm") not in (None, "norm"):
        raise ValueError(f"trainer.gradient_clip_algorithm {cfg.trainer.gradient_clip_algorithm!r}: PPG clips the "
                         "gradient norm only; leave it out or set norm")
    ppg["max_grad_norm"] = one_clip_setting(clip, ppg.get("max_grad_norm"))
    cfg.trainer.gradient_clip_val = None


def resolve_config_precision(cfg) -> None:
    """``trainer.precision`` before the Trainer is built: the deprecated ``model.network.precision``
    / ``model.proximal_precision`` set it where it is not given (and leave the model config)."""
    alias = take_precision_aliases(model_config(cfg), trainer_precision=cfg.trainer.get("precision"))
    if alias is not None and cfg.trainer.get("precision") is None:
        cfg.trainer.precision = alias
    # ``auto`` stays until the network and data are built (`PPOCLI.resolve_run_precision` measures it)


def fit_main(args: list[str] | dict | None = None, extra_callbacks=(), cli_class: type[PPOCLI] | None = None) -> PPOCLI:
    # --config takes a path or a shipped name (cartpole/ppo_ewma): resolved before LightningCLI reads it
    if isinstance(args, dict):  # values (`RunSpec.values`): each config resolved and checked as --config's
        args = {sub: {**given, "config": [str(checked_config(c)) for c in given.get("config") or []]}
                for sub, given in args.items()}
    else:
        args = resolve_config_args(trust.trust_args(list(sys.argv[1:] if args is None else args)))
    warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
    quiet_library_notices()
    # --help shows each loss setting's meaning: the attribute docstrings of ppo_lightning.algos.loss.LossSettings
    jsonargparse.set_parsing_settings(docstring_parse_attribute_docstrings=True)
    return (cli_class or PPOCLI)(  # cli_class: ppo_lightning.run.preflight's, which trains nothing
        PPOLightningModule,
        RolloutDataModule,
        trainer_class=PPOTrainer,  # Lightning's Trainer; its precision also takes "auto"
        trainer_defaults={
            "max_epochs": -1,
            "enable_model_summary": False,
            "num_sanity_val_steps": 0,
            "limit_val_batches": 0,
            "log_every_n_steps": 1,
        },
        save_config_callback=SaveRunConfig,
        save_config_kwargs={"overwrite": True, "save_to_log_dir": False},
        args=args,
        subclass_mode_model=True,  # --model my_pkg.MyModule: a PPOLightningModule subclass
        # a bad value: one line (main); no prefixes of option names: --data.total_frame is a misspelling
        # (one line naming the setting), not total_frames
        parser_kwargs={"exit_on_error": False, "allow_abbrev": False, "fit": {"exit_on_error": False, "allow_abbrev": False}},
        auto_configure_optimizers=False,
        extra_callbacks=extra_callbacks,
    )


def close_process_group() -> None:
    """Both ranks meet, then close the process group. Lightning closes it at exit only for NCCL; a
    gloo group left to interpreter teardown aborted a rank now and then after a complete run
    ("terminate called without an active exception", exit -6: seen in CI after an FSDP2 fit), the
    same race tests/test_export.py's sharded writer met. A peer that does not answer in 5 minutes
    (it failed) leaves the group as it is."""
    import datetime

    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    try:
        if dist.get_backend() == "gloo":
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=300))
        else:
            dist.barrier()
    except RuntimeError:
        return
    dist.destroy_process_group()
