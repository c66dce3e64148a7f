"""What ``fit`` takes from a checkpoint it resumes, and what it refuses (issue 48). The checkpoint is
read by `ppo_lightning.interop.checkpoint_io` (a pickle payload: one line, refused and never run);
whose run folder it is, by `ppo_lightning.interop.run_folder`.

- `check_checkpoint_code`: a class path, objective path or ``module:EnvId`` in those hyperparameters
  is imported only when the user's own command line or config names the same value, its package is
  one this project runs anyway, or ``--trust-code`` is given (`ppo_lightning.core.safety.check_code`).
- `run_root_dir`: ``--trainer.default_root_dir`` is the run folder when ``--run_dir`` is not given
  (before, it was silently replaced); both given and different is refused.
- `parse_error_line`: jsonargparse's many-line usage on a bad value, as one line.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ppo_lightning.core.safety import UnsafeInput, check_code, code_references

TRUST_ARG = "--trust_code"


def trust_args(argv: list[str]) -> list[str]:
    """``--trust-code`` (the spelling of every other command) as fit's ``--trust_code true``."""
    return [f"{TRUST_ARG}=true" if a == "--trust-code" else a for a in argv]


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


def run_root_dir(cfg) -> str | None:
    """The run folder the user asked for: ``--run_dir``, else ``--trainer.default_root_dir``; both
    given and different is `UnsafeInput` (one line)."""
    run_dir, root = cfg.get("run_dir"), cfg.trainer.get("default_root_dir")
    if run_dir and root and Path(os.path.abspath(run_dir)) != Path(os.path.abspath(root)):
        raise UnsafeInput(f"--run_dir {run_dir} and --trainer.default_root_dir {root} name two run folders: "
                          "give one (the run folder holds the checkpoints, config.yaml and videos)")
    return run_dir or (str(root) if root else None)


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
