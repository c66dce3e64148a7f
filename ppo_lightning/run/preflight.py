"""Pre-flight of ``study run`` and ``tune``: everything a worker would find wrong, found before any
worker starts, each in one line naming the arm (or trial) and the field (issue 48).

- `check_run`: a cell's run (`ppo_lightning.run.spec.RunSpec`) parsed by fit's own parser (`ppo_lightning.run.builder.PPOCLI`)
  and its model and data module built (the env's spaces), with no Trainer, folder or MLflow run: unknown
  settings, a NaN or a word where a number goes, a bad env id fail here as they would in the worker.
- `study_code` / `space_code`: what a study or space file (and the config files it names, other than
  the shipped ones) would import; refused without ``--trust-code`` (`ppo_lightning.core.safety`).
- `check_study` / `check_space`: the above for every (arm, env) of a study (envs built once each), or
  every value a search may give a group setting; `check_groups`: the groups a study run would launch,
  as their workers run them; `check_run_root`: the run root is writable and holds no symbolic link.
"""

from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path
from typing import Any

from ppo_lightning.run.spec import RunSpec
from ppo_lightning.core.safety import UnsafeInput, code_references
from ppo_lightning.core.configs import configs_dir, read_config
from ppo_lightning.core.errors import TrainingFault
from ppo_lightning.core.safety import refuse_symlinks_under
from ppo_lightning.core.storage import check_writable
from ppo_lightning.envs import make_env


class PreflightError(UnsafeInput):
    """A cell or trial that would fail in its worker: one line, exit code 2."""


def _check_cli_class():
    from ppo_lightning.run.builder import PPOCLI  # start-up cost: Lightning's CLI, only where a study or search runs

    class CheckCLI(PPOCLI):
        """fit's parser and classes, without a Trainer: nothing is trained, written or tracked."""

        def instantiate_trainer(self, **kwargs):
            from ppo_lightning.run import trust  # start-up cost: loaded with the builder above

            trust.run_root_dir(self.config[self.subcommand])  # the run folder the worker would take
            return None

        def _run_subcommand(self, subcommand: str) -> None:
            pass

    return CheckCLI


def check_run(spec: RunSpec, where: str, run_dir: str | Path | None = None) -> None:
    """Parse a run's settings as ``fit`` does and build the model and data module; `PreflightError`
    (``<where>: <field>: <reason>``) on the first problem. ``run_dir``: the run folder the worker
    gives the run (``--run_dir``), checked against the settings as the worker would check it (a
    ``trainer.default_root_dir`` naming another folder is refused). The parser's and the classes'
    output is swallowed; nothing is written."""
    import jsonargparse

    # start-up cost: fit's CLI (Lightning, TorchRL) only where a study or search runs its pre-flight
    from ppo_lightning.run import builder
    from ppo_lightning.run.trust import parse_error_line

    if run_dir is not None:
        spec = spec.with_settings({"run_dir": str(run_dir)})
    out = io.StringIO()
    logging.disable(logging.INFO)  # Lightning's "Seed set to ..." per cell: its handler holds the real stderr
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            builder.fit_main({"fit": spec.values()}, cli_class=_check_cli_class())  # as `run.train` hands it
    except jsonargparse.ArgumentError as err:
        raise PreflightError(f"{where}: {parse_error_line(str(err))}") from None
    except (ValueError, TypeError, TrainingFault) as err:
        text = str(err).strip().splitlines()
        raise PreflightError(f"{where}: {text[0] if text else type(err).__name__}") from None
    except SystemExit as err:  # the parser's own exit (should not happen with exit_on_error off)
        lines = [ln for ln in out.getvalue().splitlines() if ln.startswith("error:")]
        raise PreflightError(f"{where}: {lines[-1][len('error: '):] if lines else f'fit exits {err.code}'}") from None
    finally:
        logging.disable(logging.NOTSET)


def check_env_once(env: str, kwargs: dict[str, Any] | None, where: str) -> None:
    """Build one copy of ``env`` and close it (`PreflightError` naming it if that fails)."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            make_env(env, 1, 0, kwargs or {}).close()
    except Exception as err:  # noqa: BLE001 - any failure of the env: one line
        text = str(err).strip().splitlines()
        raise PreflightError(f"{where}: env {env!r} cannot be built ({type(err).__name__}: "
                             f"{text[0] if text else ''})") from None


def _shipped(path: Path) -> bool:
    try:
        Path(path).resolve().relative_to(configs_dir().resolve())
        return True
    except ValueError:
        return False


def config_refs(paths: list[Path]) -> list[tuple[str, str, str]]:
    """The code references (class paths, env modules) of the config files ``paths`` that are not shipped
    with the package (`ppo_lightning.core.safety.code_references`)."""
    refs = []
    for p in paths:
        if not _shipped(p):  # a config shipped in the package is the project's own
            refs += code_references(read_config(p), str(p))
    return refs


def check_run_root(run_root: Path, what: str, hint: str) -> Path:
    """The run root, created and probed writable (`ppo_lightning.core.storage.check_writable`:
    `UnwritablePath`, exit code 4), holding no symbolic link (`UnsafeInput`)."""
    check_writable(run_root, what, hint)
    refuse_symlinks_under(run_root, what)
    return run_root
