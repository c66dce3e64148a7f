"""What ``fit`` takes from a checkpoint it resumes, and what it refuses (issue 48).

- `read_checkpoint_hparams`: the checkpoint's hyperparameters, read with ``weights_only=True``; a
  pickle payload is one line saying so (refused, never run), not torch's advice to rerun unsafely.
- `check_checkpoint_code`: a class path, objective path or ``module:EnvId`` in those hyperparameters
  is imported only when the user's own command line or config names the same value, its package is
  one this project runs anyway, or ``--trust-code`` is given (`ppo_lightning.core.safety.check_code`).
- `own_tracking_state`: the run folder and MLflow run a checkpoint records are continued only when the
  checkpoint lies in that folder (resuming in place); a checkpoint naming another folder never chooses
  where this run writes.
- `run_root_dir`: ``--trainer.default_root_dir`` is the run folder when ``--run_dir`` is not given
  (before, it was silently replaced); both given and different is refused.
- `check_run_folder`: the files a run writes in its folder are not symbolic links.
- `parse_error_line`: jsonargparse's many-line usage on a bad value, as one line.
"""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path
from typing import Any

from ppo_lightning.core.errors import CheckpointError
from ppo_lightning.interop.checkpoint_io import unsafe_pickle_text
from ppo_lightning.core.safety import UnsafeInput, check_code, code_references, refuse_symlink

TRUST_ARG = "--trust_code"


def trust_args(argv: list[str]) -> list[str]:
    """``--trust-code`` (the spelling of every other command) as fit's ``--trust_code true``."""
    return [f"{TRUST_ARG}=true" if a == "--trust-code" else a for a in argv]


def read_checkpoint_hparams(ckpt_path: str | os.PathLike) -> dict:
    """``hyper_parameters`` of a ``.ckpt`` file (``{}`` for a sharded folder or none); `CheckpointError`
    in one line for a pickle payload."""
    import torch

    path = Path(ckpt_path)
    if not path.is_file():
        return {}
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:

        refused = unsafe_pickle_text(err, "checkpoint", path)
        raise CheckpointError(refused or f"checkpoint {path} does not load (UnpicklingError)") from None
    except Exception as err:  # noqa: BLE001 - a damaged file: one line
        raise CheckpointError(f"checkpoint {path} does not load ({type(err).__name__})") from None
    hparams = checkpoint.get("hyper_parameters") if isinstance(checkpoint, dict) else None
    return dict(hparams) if isinstance(hparams, dict) else {}


def _strings(data: Any) -> set[str]:
    if isinstance(data, dict):
        return {s for v in data.values() for s in _strings(v)}
    if isinstance(data, (list, tuple)):
        return {s for v in data for s in _strings(v)}
    return {data} if isinstance(data, str) else set()


def check_checkpoint_code(ckpt_path, hparams: dict, user_config: dict, trusted: bool) -> None:
    """Refuse (`ppo_lightning.core.safety.UntrustedCode`) code the checkpoint's hyperparameters would
    import that the user did not name (``user_config``: the parsed command line and configs)."""
    refs = code_references(hparams, "hyper_parameters")
    check_code(refs, f"--ckpt_path {ckpt_path}", trusted, allowed=_strings(user_config))


def checkpoint_run_dir(ckpt_path: str | os.PathLike) -> Path:
    """The run folder a checkpoint belongs to: ``<run>/checkpoints/X.ckpt`` -> ``<run>``; a file
    elsewhere (Lightning's ``<run>/hpc_ckpt_N.ckpt``) -> its folder."""
    path = Path(os.path.abspath(ckpt_path))
    return path.parent.parent if path.parent.name == "checkpoints" else path.parent


def own_tracking_state(ckpt_path, state: dict) -> dict:
    """``state`` (`ppo_lightning.training.callbacks.read_tracking_state`) when the run folder it names is
    the checkpoint's own (resuming in place), else ``{}`` with one line: another folder and its MLflow
    run are neither written nor continued."""
    recorded = state.get("run_dir")
    if not recorded:
        return {} if state.get("mlflow_run_id") else state
    own = checkpoint_run_dir(ckpt_path)
    if Path(os.path.abspath(recorded)) == own or Path(recorded).resolve() == own.resolve():
        return state
    if not Path(recorded).is_absolute() and own.as_posix().endswith("/" + Path(recorded).as_posix()):
        return {**state, "run_dir": str(own)}  # a relative folder recorded from another working directory
    print(f"[ppo-lightning] --ckpt_path {ckpt_path} records another run folder ({recorded}) and its MLflow run: "
          f"ignored, this run writes only where its command line says (a new MLflow run)", file=sys.stderr, flush=True)
    return {}


def run_root_dir(cfg) -> str | None:
    """The run folder the user asked for: ``--run_dir``, else ``--trainer.default_root_dir``; both
    given and different is `UnsafeInput` (one line)."""
    run_dir, root = cfg.get("run_dir"), cfg.trainer.get("default_root_dir")
    if run_dir and root and Path(os.path.abspath(run_dir)) != Path(os.path.abspath(root)):
        raise UnsafeInput(f"--run_dir {run_dir} and --trainer.default_root_dir {root} name two run folders: "
                          "give one (the run folder holds the checkpoints, config.yaml and videos)")
    return run_dir or (str(root) if root else None)


RUN_FOLDER_ENTRIES = ("config.yaml", "checkpoints", "videos", "checkpoints/last.ckpt", "checkpoints/mlflow-spool.jsonl")


def check_run_folder(run_dir: str | os.PathLike) -> None:
    """`UnsafeInput` if a file or folder the run writes in ``run_dir`` is a symbolic link."""
    for name in RUN_FOLDER_ENTRIES:
        refuse_symlink(Path(run_dir) / name, "run folder entry")


def parse_error_line(message: str) -> str:
    """jsonargparse's error text (a tree of ``Parser key "k":`` lines) as one line naming the field:
    ``model.clip_eps: Expected a <class 'float'>. Got value: nan``."""
    lines = [ln.strip() for ln in str(message).strip().splitlines() if ln.strip()]
    if not lines:
        return "invalid arguments"
    keys, reason = [], None
    for ln in lines:
        if ln.startswith('Parser key "'):
            key = ln[len('Parser key "'):].split('"', 1)[0]
            rest = ln.split('":', 1)[1].strip() if '":' in ln else ""
            keys.append(key)
            if rest:
                reason = rest
        elif keys and reason is None and not ln.startswith(("Does not validate", "Subtypes:", "Errors:", "- Problem with")):
            reason = ln.lstrip("- ")
    if not keys:
        return lines[0]
    field = ".".join(k for k in keys if k)  # "model" then "clip_eps" (class path mode nests the model's keys)
    return f"{field}: {reason or lines[-1]}"
