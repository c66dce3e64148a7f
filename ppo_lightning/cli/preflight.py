"""Pre-flight of ``study run`` and ``tune``: everything a worker would find wrong, found before any
worker starts, each in one line naming the arm (or trial) and the field (issue 48).

- `check_fit_args`: a cell's ``fit`` arguments parsed by fit's own parser (`ppo_lightning.cli.fit.PPOCLI`)
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

from ppo_lightning.core.safety import UnsafeInput, check_code, code_references, first_nonfinite, load_yaml


class PreflightError(UnsafeInput):
    """A cell or trial that would fail in its worker: one line, exit code 2."""


def _check_cli_class():
    from ppo_lightning.cli.fit import PPOCLI  # start-up cost: Lightning's CLI, only where a study or search runs

    class CheckCLI(PPOCLI):
        """fit's parser and classes, without a Trainer: nothing is trained, written or tracked."""

        def instantiate_trainer(self, **kwargs):
            return None

        def _run_subcommand(self, subcommand: str) -> None:
            pass

    return CheckCLI


def check_fit_args(args: list[str], where: str) -> None:
    """Parse ``fit`` arguments as ``fit`` does and build the model and data module; `PreflightError`
    (``<where>: <field>: <reason>``) on the first problem. The parser's and the classes' output is
    swallowed; nothing is written."""
    import jsonargparse

    from ppo_lightning.cli import fit as fit_cli
    from ppo_lightning.cli.trust import parse_error_line
    from ppo_lightning.core.faults import TrainingFault

    out = io.StringIO()
    logging.disable(logging.INFO)  # Lightning's "Seed set to ..." per cell: its handler holds the real stderr
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            fit_cli.fit_main(["fit", *args], cli_class=_check_cli_class())
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
    from ppo_lightning.envs import make_env

    try:
        with contextlib.redirect_stdout(io.StringIO()):
            make_env(env, 1, 0, kwargs or {}).close()
    except Exception as err:  # noqa: BLE001 - any failure of the env: one line
        text = str(err).strip().splitlines()
        raise PreflightError(f"{where}: env {env!r} cannot be built ({type(err).__name__}: "
                             f"{text[0] if text else ''})") from None


def _shipped(path: Path) -> bool:
    from ppo_lightning.core.configs import configs_dir

    try:
        Path(path).resolve().relative_to(configs_dir().resolve())
        return True
    except ValueError:
        return False


def _config_refs(paths: list[Path]) -> list[tuple[str, str, str]]:
    refs = []
    for p in paths:
        if not _shipped(p):  # a config shipped in the package is the project's own
            refs += code_references(load_yaml(p) or {}, str(p))
    return refs


def study_code(study) -> list[tuple[str, str, str]]:
    """What a study file and its non-shipped configs would import (`code_references`)."""
    refs = code_references({"fit": study.fit, "envs": list(study.envs)})
    for name, arm in study.arms.items():
        refs += code_references(arm.fit, f"arms.{name}.fit")
    return refs + _config_refs([study.resolve(c) for c in dict.fromkeys([*study.base, *(c for a in study.arms.values()
                                                                                          for c in a.configs)])])


def check_study(study, trust_code: bool = False) -> None:
    """A study's pre-flight (module doc): code, values, then every (arm, env) through fit's parser."""
    from ppo_lightning.studies import runner

    check_code(study_code(study), str(study.path), trust_code)
    for name, arm in study.arms.items():
        bad = first_nonfinite({**study.fit, **arm.fit})
        if bad is not None:
            raise PreflightError(f"{study.path}: arm {name}: {bad[0]} is {bad[1]!r}, not a finite number")
    built: set[str] = set()
    for env in study.envs:
        for name in study.arms:
            check_fit_args(runner.cell_args(study, name, env, study.seeds[0]), f"{study.path}: arm {name} on {env}")
        if env not in built:
            check_env_once(env, None, f"{study.path}")
            built.add(env)
    try:
        for name in study.arms:  # the group planner's arithmetic on the arms' settings
            runner.member_values(study, name)
    except (TypeError, ValueError) as err:
        raise PreflightError(f"{study.path}: arm {name}: {err}") from None


def check_groups(study, run_root: Path, workers: int) -> None:
    """The groups ``study run`` would launch now (`ppo_lightning.studies.runner.plan` on the cells not
    recorded), each through fit's parser once per (env, arms, packed or not): a packing fit refuses
    (vectorized members on an env without a batched step) is one line naming the arms, before any worker."""
    from ppo_lightning.studies import runner

    done = runner.done_cells(study, run_root)
    seen: set = set()
    for group in runner.plan(study, set(done), workers, done.values()):
        arms = tuple(dict.fromkeys(a for a, _ in group.members))
        key = (group.env, arms, len(group.members) > 1)
        if key in seen:
            continue
        seen.add(key)
        what = f"arm {arms[0]}" if len(arms) == 1 else f"arms {', '.join(arms)}"
        check_fit_args(group.args, f"{study.path}: {what} on {group.env} as a group of {len(group.members)} members")


def space_code(space) -> list[tuple[str, str, str]]:
    """What a search-space file and its non-shipped configs would import."""
    choices = {name: list(p.choices) for name, p in space.params.items() if p.kind == "categorical"}
    refs = code_references({"fit": space.fit, "env": space.env, "params": choices})
    return refs + _config_refs([space.resolve(c) for c in space.base])


def check_space(space, trust_code: bool = False) -> None:
    """A search's pre-flight: code, then a trial at the low end / first choice of every parameter, and
    one per further choice of a categorical one, through fit's parser; the env built once."""
    from ppo_lightning.tuning import runner

    check_code(space_code(space), str(space.path), trust_code)
    bad = first_nonfinite(space.fit, "fit")
    if bad is not None:
        raise PreflightError(f"{space.path}: {bad[0]} is {bad[1]!r}, not a finite number")
    first = {n: (p.choices[0] if p.kind == "categorical" else (int(p.low) if p.kind == "int" else p.low))
             for n, p in space.params.items()}
    trials = [first] + [{**first, n: c} for n, p in space.params.items() if p.kind == "categorical" for c in p.choices[1:]]
    for values in trials:
        shown = ", ".join(f"{k}={v}" for k, v in values.items())
        check_fit_args(runner.single_args(space, values, space.seeds[0]), f"{space.path}: a trial with {shown}")
    check_env_once(space.env, None, str(space.path))


def check_run_root(run_root: Path, what: str, hint: str) -> Path:
    """The run root, created and probed writable (`ppo_lightning.core.storage.check_writable`:
    `UnwritablePath`, exit code 4), holding no symbolic link (`UnsafeInput`)."""
    from ppo_lightning.core.safety import refuse_symlinks_under
    from ppo_lightning.core.storage import check_writable

    check_writable(run_root, what, hint)
    refuse_symlinks_under(run_root, what)
    return run_root
