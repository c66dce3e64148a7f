"""A study's pre-flight, before any worker starts: what its file would import (refused without
``--trust-code``), finite values, every (arm, env) and every group it would launch through ``fit``'s own
parser, each env built once (the shared checks: `ppo_lightning.run.preflight`)."""

from __future__ import annotations

import sys
from pathlib import Path

from ppo_lightning.run.preflight import PreflightError, config_refs, check_env_once, check_run
from ppo_lightning.core.safety import check_code, code_references, first_nonfinite
from ppo_lightning.studies import runner


def study_code(study) -> list[tuple[str, str, str]]:
    """What a study file and its non-shipped configs would import (`code_references`)."""
    refs = code_references({"fit": study.fit, "envs": list(study.envs)})
    for name, arm in study.arms.items():
        refs += code_references(arm.fit, f"arms.{name}.fit")
    return refs + config_refs([study.resolve(c) for c in dict.fromkeys([*study.base, *(c for a in study.arms.values()
                                                                                          for c in a.configs)])])


def check_study(study, trust_code: bool = False) -> None:
    """A study's pre-flight (module doc): code, values, then every (arm, env) through fit's parser."""
    check_code(study_code(study), str(study.path), trust_code)
    for name, arm in study.arms.items():
        bad = first_nonfinite({**study.fit, **arm.fit})
        if bad is not None:
            raise PreflightError(f"{study.path}: arm {name}: {bad[0]} is {bad[1]!r}, not a finite number")
    for name in study.arms:  # shared settings an arm's objective ignores: its runs take the defaults (runner.shared_unused)
        for key, default in runner.shared_unused(study, name).items():
            given = f"{study.fit[key]!r} of the study's fit" if key in study.fit else "of the base config"
            print(f"warning: {study.path}: arm {name}'s objective ignores {key} {given} (shared by the arms): its "
                  f"runs have {key} {default!r}, which trains the same", file=sys.stderr, flush=True)
    built: set[str] = set()
    for env in study.envs:
        for name in study.arms:
            check_run(runner.cell_spec(study, name, env, study.seeds[0]), f"{study.path}: arm {name} on {env}")
        if env not in built:
            check_env_once(env, None, f"{study.path}")
            built.add(env)
    try:
        for name in study.arms:  # the group planner's arithmetic on the arms' settings
            runner.member_values(study, name)
    except (TypeError, ValueError) as err:
        raise PreflightError(f"{study.path}: arm {name}: {err}") from None


def check_groups(study, run_root: Path, workers: int, envs: tuple[str, ...] | None = None,
                 arms: tuple[str, ...] | None = None) -> None:
    """The groups ``study run`` would launch now (`ppo_lightning.studies.runner.plan` on the cells not
    recorded), each through fit's parser once per (env, arms, packed or not): a packing fit refuses
    (vectorized members on an env without a batched step) is one line naming the arms, before any worker."""
    done = runner.done_cells(study, run_root)
    seen: set = set()
    for group in runner.plan(study, set(done), workers, done.values(), envs, arms):
        arms = tuple(dict.fromkeys(a for a, _ in group.members))
        key = (group.env, arms, len(group.members) > 1)
        if key in seen:
            continue
        seen.add(key)
        what = f"arm {arms[0]}" if len(arms) == 1 else f"arms {', '.join(arms)}"
        check_run(group.spec, f"{study.path}: {what} on {group.env} as a group of {len(group.members)} members",
                  run_dir=Path(run_root) / "groups" / group.name)  # the folder its worker gives it
