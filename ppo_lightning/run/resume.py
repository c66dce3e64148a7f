"""What the command line means for a resumed run, and settings the parser cannot take by itself.

**Resume** (``--ckpt_path``; `before_checkpoint_settings` and `after_checkpoint_settings`, around
LightningCLI's reading of the checkpoint's hyperparameters): the checkpoint's model settings and the data settings that shape the run
(`DATA_RESTORED`: ``total_frames``, the batch sizes, gamma, ...) are the run's; the config's values
give way to them. A setting given on the command line (``--model.X`` / ``--data.X`` / ``--model`` /
``--seeds``) that differs from the checkpoint's is a one-line error, unless it is declared safe to change
on resume (`MODEL_SAFE`, `DATA_SAFE`, a module subclass's ``resume_safe`` names) or named in
``--resume_override model.X,data.Y`` (the command line's value is then used). One line says what came
from the checkpoint (`resume_line`). Checkpoints without data hyperparameters (older ones) resume
with the config's data settings, as before.

**Dotted settings in a dict** (`split_dotted`, `apply_dotted`): ``--model.objective_args.eps_high 0.3``,
``--model.loss.init_args.delta 0.5``, ``--model.schedules.entropy_coef linear`` change one entry of a
dict-valued model setting (`DICT_SETTINGS`) and keep the rest of it.

**Unknown settings** (`unknown_setting`): a misspelled ``--model.X`` / ``--data.X`` is named in one line
with the class that lacks it (a subclass given with ``--model``) and the closest setting it has.
"""

from __future__ import annotations

import copy
import difflib
import inspect
import importlib
import os
from pathlib import Path
from typing import Any

import yaml

from ppo_lightning.core.configs import plain
from ppo_lightning.core.errors import CheckpointError
from ppo_lightning.interop.checkpoint_io import DATA_STATE_KEY, read_hparams, read_meta
from ppo_lightning.run.trust import check_checkpoint_code

# Dict-valued model settings whose entries take dotted command-line overrides.
DICT_SETTINGS = ("objective_args", "value_loss_args", "aux_terms", "schedules", "loss", "ppg")
# Model settings that may change on resume without --resume_override (they do not change what is learned).
MODEL_SAFE = ("max_bad_steps", "compile", "micro_batch_size", "init_from")
# Model settings the optimizer's state holds (Lightning restores it): no change on resume takes effect.
OPTIMIZER_STATE = ("lr", "adam_betas", "adam_eps", "optimizer")
# Model settings that come from the data side (linked by the CLI), never compared here.
MODEL_LINKED = ("observation_space", "action_space", "seeds", "member_hparams")
# Data settings that may change on resume: a longer (or shorter) run. Frame-based schedules follow the new total.
DATA_SAFE = ("total_frames",)
# Data settings of the machine, not of the run: never restored, free to change.
DATA_RUNTIME = ("num_threads", "env_timeout_s", "batched_rollout")
# Data settings `--scale c` rewrites (ppo_lightning.algos.scaling.apply_scale): not restored under --scale.
DATA_SCALED = ("num_envs", "rollout_steps", "advantage_norm_span")
DEFAULT_MODEL = "ppo_lightning.training.module.PPOLightningModule"


def _show(value: Any, width: int = 48) -> str:
    text = yaml.safe_dump(plain(value), default_flow_style=True, width=10**6).strip()
    text = text[:-4].strip() if text.endswith("\n...") or text.endswith(" ...") else text
    return text if len(text) <= width else text[: width - 3] + "..."


# ---------------------------------------------------------------------- the command line's explicit settings
def explicit_settings(argv: list[str]) -> set[str]:
    """The settings an argv gives explicitly: ``model.<name>`` (the first part after ``--model.`` /
    ``--model.init_args.``), ``model.class_path`` for ``--model X``, ``data.<name>``, and
    ``data.num_seeds`` for ``--seeds``."""
    out = set()
    for token in argv:
        if not token.startswith("--"):
            continue
        key = token[2:].split("=", 1)[0]
        if key == "model":
            out.add("model.class_path")
        elif key == "seeds":
            out.add("data.num_seeds")
        elif key.startswith(("model.", "data.")):
            section, rest = key.split(".", 1)
            if rest.startswith("init_args."):
                rest = rest[len("init_args."):]
            if rest and rest != "help":
                out.add(f"{section}.{rest.split('.', 1)[0]}")
    return out


# ---------------------------------------------------------------------- dotted entries of dict settings
def split_dotted(argv: list[str]) -> tuple[list[str], list[tuple[str, list[str], str]]]:
    """``argv`` without the dotted overrides of `DICT_SETTINGS` entries, and those overrides as
    ``(setting, path, value text)``."""
    rest, overrides, i = [], [], 0
    while i < len(argv):
        token = argv[i]
        key, eq, inline = token[2:].partition("=") if token.startswith("--model.") else ("", "", "")
        parts = key.split(".")[1:]
        if parts[:1] == ["init_args"]:
            parts = parts[1:]
        if len(parts) >= 2 and parts[0] in DICT_SETTINGS:
            if eq:
                value = inline
            elif i + 1 < len(argv):
                value, i = argv[i + 1], i + 1
            else:
                raise ValueError(f"{token} needs a value")
            overrides.append((parts[0], parts[1:], value))
        else:
            rest.append(token)
        i += 1
    return rest, overrides


def split_dotted_values(settings: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, list[str], Any]]]:
    """`split_dotted` for dotted settings given as values (``{"model.objective_args.eps_high": 0.3}``)."""
    rest, overrides = {}, []
    for key, value in settings.items():
        parts = key.split(".")[1:] if key.startswith("model.") else []
        if parts[:1] == ["init_args"]:
            parts = parts[1:]
        if len(parts) >= 2 and parts[0] in DICT_SETTINGS:
            overrides.append((parts[0], parts[1:], value))
        else:
            rest[key] = value
    return rest, overrides


def apply_dotted(model_cfg, overrides: list[tuple[str, list[str], str]], only: set[str] | None = None) -> None:
    """Set each override's entry in its dict setting (created where null), keeping the other entries.
    ``only``: the settings to apply (all by default)."""
    for name, path, text in overrides:
        if only is not None and name not in only:
            continue
        root = plain(model_cfg.get(name)) or {}
        if not isinstance(root, dict):
            raise ValueError(f"--model.{name}.{'.'.join(path)}: model.{name} is not a mapping ({root!r})")
        node = root
        for part in path[:-1]:
            child = node.get(part)
            node[part] = child = {} if child is None else child
            if not isinstance(child, dict):
                raise ValueError(f"--model.{name}.{'.'.join(path)}: model.{name}.{part} is not a mapping ({child!r})")
            node = child
        node[path[-1]] = yaml.safe_load(text) if isinstance(text, str) else copy.deepcopy(text)
        model_cfg[name] = root


def checkpoint_class(path) -> str | None:
    """The module class a checkpoint names (``_class_path``), or None (no file, an unreadable one)."""
    if not path or not Path(path).is_file():
        return None
    try:
        hparams = read_hparams(path)
    except CheckpointError:  # an unreadable file is reported by the checkpoint check, in one line
        return None
    return str(hparams["_class_path"]) if hparams.get("_class_path") else None


def with_checkpoint_class(argv: list[str]) -> list[str]:
    """With ``--ckpt_path`` of a module subclass's checkpoint and no ``--model`` class, ``--model <its
    class>`` before the first ``--model.X``: its own settings (``--model.max_clip_fraction``) parse on resume."""
    if any(t == "--model" or t.startswith("--model=") for t in argv):
        return argv
    path = next((argv[i + 1] for i, t in enumerate(argv[:-1]) if t == "--ckpt_path"), None) or next(
        (t.split("=", 1)[1] for t in argv if t.startswith("--ckpt_path=")), None)
    cls = checkpoint_class(path)
    if not cls:
        return argv
    i = next((j for j, t in enumerate(argv) if t.startswith("--model.")), len(argv))
    return argv[:i] + ["--model", cls] + argv[i:]


# ---------------------------------------------------------------------- unknown settings, in one line
def _import(path: str):
    module, _, name = str(path).rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None


def accepted_settings(cls) -> set[str]:
    """The settings a model or data class takes: its ``__init__`` keyword arguments, its bases' where it
    passes ``**kwargs`` on, and the loss settings for the built-in module."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        params = inspect.signature(klass.__init__).parameters.values()
        names |= {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"}
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
        if klass.__module__ == "ppo_lightning.training.module" and klass.__name__ == "PPOLightningModule":
            # start-up cost: the loss module (torch, TorchRL) only when a checkpoint's module class is read
            from ppo_lightning.algos.loss import LOSS_SETTINGS

            names |= set(LOSS_SETTINGS)
            break
    return names


def unknown_setting(argv: list[str], config_model_class: str | None = None) -> str | None:
    """A one-line message for the first ``--model.X`` / ``--data.X`` that its class does not take, or
    None. The model class is the one given with ``--model`` (last), else ``config_model_class``."""
    from ppo_lightning.data.datamodule import RolloutDataModule

    model_path = config_model_class or DEFAULT_MODEL
    for i, token in enumerate(argv):
        if token == "--model" and i + 1 < len(argv) and not argv[i + 1].startswith(("--", "{")):
            model_path = argv[i + 1]
        elif token.startswith("--model=") and not token[8:].startswith("{"):
            model_path = token[8:]
    model_cls = _import(model_path) if "." in model_path else _import(f"ppo_lightning.training.module.{model_path}")
    classes = {"model": (model_cls, model_path), "data": (RolloutDataModule, "RolloutDataModule")}
    for token in argv:
        for key in explicit_settings([token]):
            section, name = key.split(".", 1)
            cls, shown = classes[section]
            if cls is None or name == "class_path" or (section == "data" and name == "num_seeds"):
                continue
            known = accepted_settings(cls)
            if name not in known:
                close = difflib.get_close_matches(name, sorted(known), n=1)
                hint = f"; did you mean --{section}.{close[0]}?" if close else ""
                return f"--{section}.{name}: {shown} has no setting {name!r}{hint}"
    return None


# ---------------------------------------------------------------------- resume
def class_name(path: str) -> str:
    """A class path as its class's own ``module.qualname`` (aliases such as ``ppo_lightning.PPOLightningModule``
    name the same class); the path itself where it does not import."""
    cls = _import(path) if "." in str(path) else _import(f"ppo_lightning.training.module.{path}")
    return f"{cls.__module__}.{cls.__qualname__}" if isinstance(cls, type) else str(path)


def resume_safe(model_class_path: str | None) -> set[str]:
    """`MODEL_SAFE` and the names a module subclass declares in its ``resume_safe`` attribute."""
    cls = _import(model_class_path) if model_class_path else None
    return set(MODEL_SAFE) | set(getattr(cls, "resume_safe", ()) or ())


def parse_overrides(text: str | None) -> set[str]:
    """``--resume_override model.x,data.y`` as a set; every name has its section."""
    names = {t.strip() for t in (text or "").split(",") if t.strip()}
    bad = [n for n in names if not n.startswith(("model.", "data."))]
    if bad:
        raise ValueError(f"--resume_override takes model.<name> or data.<name> settings, comma separated; got {', '.join(bad)}")
    return names


class ResumeRefused(ValueError):
    """A command-line setting differs from the checkpoint's and may not change on resume."""


def reconcile(cfg_before: dict[str, Any], ckpt: dict[str, Any], given: set[str], overrides: set[str],
              safe: set[str], rescale: bool = False, scaled: bool = False,
              dotted: list[tuple[str, list[str], str]] | None = None) -> tuple[dict[str, Any], list[str], list[str]]:
    """Decide each setting of a resumed run.

    ``cfg_before``: ``{"model.x": value, "data.y": value}`` as the config and command line give them;
    ``ckpt``: the checkpoint's, the same way. ``dotted``: the dict entries the command line changes
    (`split_dotted`) of the settings it gives only that way: such a setting, where its change is allowed,
    is the checkpoint's dict with those entries changed. Returns ``(values to set, kept, changed)``: the
    values of the settings that differ from ``cfg_before`` (the checkpoint's, or the command line's where
    a change is allowed), and the descriptions of what came from the checkpoint and what changed (a
    dict setting shown whole, as it will run). Raises `ResumeRefused` (one line) for a refused change."""
    out, kept, changed = {}, [], []
    entries_only = {name for name, _, _ in dotted or []}
    for key, saved in ckpt.items():
        section, name = key.split(".", 1)
        here = cfg_before.get(key, saved)
        if section == "model" and name in entries_only and key in given:
            merged = {name: plain(saved)}  # the checkpoint's dict with the command line's entries
            apply_dotted(merged, dotted, only={name})
            here = merged[name]
        if section == "model" and name in MODEL_LINKED:
            continue
        if section == "data" and name in DATA_RUNTIME:
            continue
        if section == "data" and scaled and name in DATA_SCALED:
            continue  # --scale rewrites them from the config's c = 1 values (checked by rescale)
        same = plain(here) == plain(saved)
        if key in given:
            if same or matches(here, saved):
                continue
            # data.num_envs: another batch per rank is --rescale's to allow or refuse (ppo_lightning.training.rescale)
            allowed = (key in overrides or (section == "model" and name in safe) or (section == "data" and name in DATA_SAFE)
                       or key == "data.num_envs")
            if allowed and section == "model" and name in OPTIMIZER_STATE:
                raise ResumeRefused(f"--{key}: the optimizer's state, restored from the checkpoint, holds it; it "
                                    "cannot change on resume (start a new run, e.g. with model.init_from)")
            if not allowed:
                raise ResumeRefused(
                    f"--{key} {_show(here)} differs from the checkpoint's {_show(saved)}: a resumed run keeps its "
                    f"settings; add --resume_override {key} to change it on resume, or drop --{key}")
            out[key] = here
            changed.append(f"{key} {_show(saved)} -> {_show(here)}")
        elif not same:
            out[key] = saved
            if not matches(here, saved):  # a mapping the module completed with its defaults is the same setting
                kept.append(f"{key}={_show(saved)}")
    unused = sorted(overrides - given)
    if unused:
        raise ValueError(f"--resume_override {', '.join(unused)}: not given on the command line (give the new value too)")
    return out, kept, changed


def matches(given: Any, saved: Any) -> bool:
    """Whether a setting as given agrees with the checkpoint's: equal, or a mapping each of whose entries
    agrees with the checkpoint's (the module completes ``model.ppg`` and ``model.network`` with defaults)."""
    given, saved = plain(given), plain(saved)
    if isinstance(given, dict) and isinstance(saved, dict):
        return all(k in saved and matches(v, saved[k]) for k, v in given.items())
    if isinstance(given, list) and isinstance(saved, list):
        return len(given) == len(saved) and all(matches(a, b) for a, b in zip(given, saved))
    return given == saved


def resume_line(path: str, frames: int | None, kept: list[str], changed: list[str]) -> str:
    """The one line a resume prints: what came from the checkpoint, and what the command line changed."""
    state = "weights, optimizer and run state" + (f" ({frames} frames)" if frames is not None else "")
    line = f"resume from {path}: {state} from the checkpoint"
    line += f"; settings from the checkpoint over the config: {', '.join(kept)}" if kept else \
        "; every setting as the config's"
    if changed:
        line += f"; changed on the command line: {', '.join(changed)}"
    return line


# ---------------------------------------------------------------------- the parsed config of a resumed run
MODEL_CLASS_PATH = DEFAULT_MODEL
# The model settings ``--scale`` writes (ppo_lightning.algos.scaling.apply_scale).
SCALED_MODEL_KEYS = ("lr", "proximal_com", "adam_betas", "ppg")


def model_config(cfg):
    """The model's settings in a parsed config: ``model.init_args`` (the model is a class path and
    its init arguments, `PPOLightningModule` or a subclass)."""
    model = cfg.model
    return model.init_args if "init_args" in model else model


def fill_data_seed(cfg) -> None:
    """``seed_everything`` also seeds the environments and the shuffling, unless ``data.seed`` is set."""
    seed = cfg.get("seed_everything")
    if cfg.data.get("seed") is None and isinstance(seed, int) and not isinstance(seed, bool):
        cfg.data.seed = seed


def settings_before(cfg) -> dict:
    """The model and data settings as the config and the command line give them (before the
    checkpoint's are read), by ``model.<name>`` / ``data.<name>``."""
    fill_data_seed(cfg)
    model = model_config(cfg)
    out = {f"model.{k}": copy.deepcopy(plain(v)) for k, v in dict(model).items()}
    out["model.class_path"] = class_name(cfg.model.get("class_path") or MODEL_CLASS_PATH)
    out.update({f"data.{k}": copy.deepcopy(plain(v)) for k, v in dict(cfg.data).items()})
    if cfg.get("seeds") is not None:
        out["data.num_seeds"] = cfg.seeds
    return out


def before_checkpoint_settings(cfg) -> dict:
    """Before LightningCLI puts the checkpoint's model hyperparameters over the config's: code the
    checkpoint names is refused unless the user named it (`ppo_lightning.run.trust.check_checkpoint_code`);
    the settings as given are kept for `after_checkpoint_settings`. Those of a run trained with
    ``--scale c`` are already scaled, and the scaling would apply a second time (lr / c, center of
    mass x c^2): with ``--scale``, the scaled keys keep the command line's c = 1 values, and
    `ppo_lightning.training.rescale.check_resumed_scaled_settings` compares the result of scaling them
    with the checkpoint's after the scaling."""
    keep = None
    if cfg.get("scale") is not None:
        model = model_config(cfg)
        keep = {k: copy.deepcopy(model[k]) for k in SCALED_MODEL_KEYS if k in model}
    is_file = Path(cfg.ckpt_path).is_file()
    check_checkpoint_code(cfg.ckpt_path, read_hparams(cfg.ckpt_path) if is_file else {}, cfg.as_dict(),
                          bool(cfg.get("trust_code")))
    return {"keep": keep, "before": settings_before(cfg) if is_file else None}


def after_checkpoint_settings(cfg, pending: dict, argv: list[str], dotted: list[tuple[str, list[str], str]]) -> None:
    """After LightningCLI read the checkpoint's hyperparameters: ``--scale``'s c = 1 values back, then
    the checkpoint's model and data settings are the run's; a command-line setting that differs is an
    error unless safe or in ``--resume_override`` (`reconcile`). Prints the one line of what came from
    the checkpoint (`resume_line`)."""
    for k, v in (pending["keep"] or {}).items():
        model_config(cfg)[k] = v
    before = pending["before"]
    if before is None:
        return
    ckpt = read_meta(cfg.ckpt_path, mmap=True)
    hparams = {k: v for k, v in (ckpt.get("hyper_parameters") or {}).items() if k not in ("_instantiator", "_class_path")}
    saved = {f"model.{k}": v for k, v in hparams.items()}
    saved["model.class_path"] = class_name((ckpt.get("hyper_parameters") or {}).get("_class_path", MODEL_CLASS_PATH))
    scaled = cfg.get("scale") is not None
    if scaled:  # kept at the command line's c = 1 values and checked after scaling (rescale)
        saved = {k: v for k, v in saved.items() if k.split(".", 1)[1] not in SCALED_MODEL_KEYS}
    data = {k: v for k, v in (ckpt.get("datamodule_hyper_parameters") or {}).items() if k != "_instantiator"}
    saved.update({f"data.{k}": v for k, v in data.items() if k in cfg.data})
    given = explicit_settings(argv)
    overrides = parse_overrides(cfg.get("resume_override"))
    # a dict setting the command line changes only entry by entry: on the checkpoint's dict
    dotted = [d for d in dotted if f"--model.{d[0]}" not in argv]
    values, kept, changed = reconcile(
        before, saved, given, overrides, resume_safe(before.get("model.class_path")),
        rescale=bool(cfg.get("rescale")), scaled=scaled, dotted=dotted)
    model = model_config(cfg)
    for key, value in values.items():
        section, name = key.split(".", 1)
        if key == "model.class_path":
            cfg.model.class_path = value
        elif section == "model":
            model[name] = value
        elif name == "num_seeds" and cfg.get("seeds") is not None:
            cfg.seeds = value
        else:
            cfg.data[name] = value
    frames = (ckpt.get(DATA_STATE_KEY) or {}).get("frames")
    if os.environ.get("LOCAL_RANK", "0") == "0" and os.environ.get("NODE_RANK", "0") == "0":
        print(resume_line(str(cfg.ckpt_path), frames, kept, changed), flush=True)
