"""A search's pre-flight, before any worker starts: what its space file would import (refused without
``--trust-code``), finite values, a trial per parameter's low end and per categorical choice through
``fit``'s own parser, the env built once (the shared checks: `ppo_lightning.run.preflight`)."""

from __future__ import annotations

from pathlib import Path

from ppo_lightning.run.preflight import PreflightError, config_refs, check_env_once, check_run
from ppo_lightning.core.safety import check_code, code_references, first_nonfinite
from ppo_lightning.tuning import runner


def space_code(space) -> list[tuple[str, str, str]]:
    """What a search-space file and its non-shipped configs would import."""
    choices = {name: list(p.choices) for name, p in space.params.items() if p.kind == "categorical"}
    refs = code_references({"fit": space.fit, "env": space.env, "params": choices})
    return refs + config_refs([space.resolve(c) for c in space.base])


def check_space(space, trust_code: bool = False, run_root: Path | None = None) -> None:
    """A search's pre-flight: code, then a trial at the low end / first choice of every parameter, and
    one per further choice of a categorical one, through fit's parser (in a group folder of
    ``run_root``, as a worker runs it); the env built once."""
    check_code(space_code(space), str(space.path), trust_code)
    bad = first_nonfinite(space.fit, "fit")
    if bad is not None:
        raise PreflightError(f"{space.path}: {bad[0]} is {bad[1]!r}, not a finite number")
    first = {n: (p.choices[0] if p.kind == "categorical" else (int(p.low) if p.kind == "int" else p.low))
             for n, p in space.params.items()}
    trials = [first] + [{**first, n: c} for n, p in space.params.items() if p.kind == "categorical" for c in p.choices[1:]]
    for values in trials:
        shown = ", ".join(f"{k}={v}" for k, v in values.items())
        check_run(runner.single_spec(space, values, space.seeds[0]), f"{space.path}: a trial with {shown}",
                  run_dir=None if run_root is None else Path(run_root) / "groups" / "trials-0")  # a worker's folder
    check_env_once(space.env, None, str(space.path))
