"""``ppo-lightning study run|status``: a study's pending cells, packed into vectorized groups, run on
submitit's executors (SLURM where ``srun`` exists, local processes otherwise).

Packing: per environment, the arms that differ only in settings a group member may carry (the lr,
Adam's betas, the EWMA's center of mass or none, the advantage span, the clip range, the entropy and
value coefficients, the KL beta, gamma and GAE lambda:
`ppo_lightning.core.members.MEMBER_SETTINGS`) train as one group of all their pending (arm, seed)
cells (``data.member_seeds``, ``data.member_hparams``; member k is tested equal to its single run);
an arm that cannot be a member (configs of its own, e.g. ``[minatar/ppg]``) trains its seeds as a group of its own;
artificial staleness runs seed by seed. Each group's time is estimated (`group_cost`: members plus a
group's own overhead, x frames, x a rate per member and frame measured from the study's recorded
cells, else a default per game), groups are split by members where that shortens the makespan on the
workers by more than the packing it loses (`balance`), and dealt longest first to the least loaded
worker (`lpt`); each worker is one submitit job.

A rerun skips recorded cells. A group checkpoints every `CHECKPOINT_FRAMES` frames per member; a
killed or preempted group continues from its last checkpoint, bitwise, when its arguments are the
ones that wrote it (the project's resume). On SLURM, submitit's checkpointing hook requeues a
preempted job, which runs its groups again: finished ones are skipped, the interrupted one resumes.

Records: an MLflow parent run per study (experiment = the study's name), a run per group attempt and
one per cell (tags study, arm, env, seed, cpu, precision; curves by frames); each finished cell also
lands in ``<run root>/cells/*.json`` and, at the end of ``run``, in the CSV export next to the
study file (`ppo_lightning.studies.records`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ppo_lightning.core.hardware import core_count, cpu_label
from ppo_lightning.core.safety import load_json, load_yaml, open_nofollow
from ppo_lightning.core.members import ALWAYS_MEMBER_SETTINGS, MEMBER_OPTIONS, OPTIONAL_MEMBER_OPTIONS
from ppo_lightning.run.harness import (check_checkpoint_file, objective_settings_unused, probe_tracking_store,
                                       scale_member_settings)
from ppo_lightning.run.spec import Members, RunSpec, train
from ppo_lightning.studies.records import Cell, atomic_write, curve_auc, export_cells, final_value, legacy_cells, write_export
from ppo_lightning.studies.spec import Study, load_study, merge_configs

CHECKPOINT_FRAMES = 65_536
# fit options a member carries besides these, with the module's and data module's defaults
LOSS_AND_RETURN_KEYS = OPTIONAL_MEMBER_OPTIONS
FAULT_PREFIX = re.compile(r"^ppo_lightning\.[\w.]+\.(\w+): ")  # a worker's traceback ends "module.Class: message"
MEMBER_KEYS = (*MEMBER_OPTIONS, "model.decoupled", "scale_rules", "scale_adam_betas")
ADAM_BETAS = [0.9, 0.999]


ERROR_LINE = re.compile(r"^(error: |[\w.]*(Error|Exception|Fault|Full|Input|Code)\b.*: )")  # ...Input, ...Code: UnsafeInput, UntrustedCode


def first_error_line(log: str) -> str | None:
    """The first line of a worker's log that states an error: a one-line error of ours (``error: ...``),
    else the first exception line of a traceback (``SomeError: message``, its module path dropped)."""
    lines = [ln.strip() for ln in log.splitlines()]
    for pick in (lambda ln: ln.startswith("error: "), lambda ln: bool(ERROR_LINE.match(ln))):
        for ln in lines:
            if pick(ln):
                return re.sub(r"^[\w.]+\.(\w+): ", r"\1: ", ln)  # the exception's class without its module
    return None


def job_failures(jobs, what=None) -> list[str]:
    """Waits for every submitit job; one line per job that failed, so that a runner reports every
    worker's failure, then exits non-zero: ``what(i)`` names what job i was doing (a study's group and
    its arms), then the first error line of its log (else its error's last line) and the log's path."""
    failed = []
    for i, j in enumerate(jobs):
        try:
            j.result()
        except Exception as err:  # noqa: BLE001 - every worker's failure is reported
            last = str(err).strip().splitlines()[-1] if str(err).strip() else repr(err)
            try:
                log = Path(j.paths.stderr)
                line = first_error_line(log.read_text(errors="replace")) or FAULT_PREFIX.sub("", last)
            except (OSError, AttributeError):
                log, line = None, FAULT_PREFIX.sub("", last)
            doing = f" ({what(i)})" if what is not None and what(i) else ""
            failed.append(f"job {j.job_id}{doing}: {line}" + (f" [log: {log}]" if log is not None else ""))
    return failed


class SubmissionFailed(RuntimeError):
    """A scheduler refused the jobs (SLURM's controller unreachable, a bad partition): one line."""


def submit_jobs(ex, payloads: list) -> list:
    """Submits one job per payload; a refusal from the scheduler becomes `SubmissionFailed` with its
    first line (submitit raises a `FailedJobError` carrying sbatch's whole stderr and a traceback)."""
    import submitit

    try:
        return [ex.submit(p) for p in payloads]
    except (submitit.core.utils.FailedJobError, subprocess.CalledProcessError, OSError) as err:
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
        first = next((ln for ln in lines if "error" in ln.lower()), lines[0] if lines else repr(err))
        hint = "; `--executor local` runs the jobs as processes on this machine" if ex.cluster == "slurm" else ""
        raise SubmissionFailed(f"{ex.cluster} refused the jobs: {first}{hint}") from None


class _Stopped(BaseException):
    def __init__(self, signum: int) -> None:
        self.signum = signum


@contextlib.contextmanager
def jobs_stop_with_the_launcher(jobs, tag: str, rerun: str, grace_s: float = 120.0):
    """While a launcher waits on its submitit jobs, SIGTERM or SIGINT to it stops its local jobs too
    (Ctrl-C in a terminal reaches them itself, and submitit's local controller kills its job a second later),
    as a preemption stops a run: SIGTERM to each job's process (a local job's id is its pid; submitit's
    controller hands the signal to the training, which checkpoints at the end of its iteration and
    exits); a job still running ``grace_s`` later (a signal that came before its training set its
    handler) is cancelled (``job.cancel()``: the controller interrupts its task, then kills it), and
    its group resumes from its last periodic checkpoint. Then the launcher exits 128 + the signal with one line. Local jobs are
    processes of their own: left alone they would outlive the launcher and a rerun would start the
    same groups beside them (`group_lock` keeps those apart). SLURM jobs run on: the line names them."""
    import threading

    if threading.current_thread() is not threading.main_thread():  # signal handlers live in the main thread
        yield
        return

    def stop(signum, frame):
        raise _Stopped(signum)

    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    except _Stopped as got:
        for s, h in old.items():  # a second signal ends the launcher at once
            signal.signal(s, h)
        import submitit

        local = [j for j in jobs if isinstance(j, submitit.LocalJob) and not j.done()]
        for j in local:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(j.job_id), signal.SIGTERM)
        end = time.monotonic() + grace_s
        while time.monotonic() < end and not all(j.done() for j in local):
            time.sleep(0.2)
        killed = [j for j in local if not j.done()]
        for j in killed:
            j.cancel()
        # the controller kills its task a second after interrupting it; 10 s did not always suffice on 2 loaded cores
        end = time.monotonic() + 30.0
        while time.monotonic() < end and not all(j.done() for j in killed):
            time.sleep(0.2)
        cluster = [j.job_id for j in jobs if not isinstance(j, submitit.LocalJob) and not j.done()]
        name = signal.Signals(got.signum).name
        print(f"[{tag}] stopped by {name}: {len(local) - len(killed)} local job(s) checkpointed and stopped"
              + (f", {len(killed)} killed after {grace_s:.0f} s (their groups resume from their last checkpoint)" if killed else "")
              + (f"; SLURM jobs {', '.join(cluster)} run on (scancel them to stop them)" if cluster else "")
              + f"; {rerun} continues", flush=True)
        raise SystemExit(128 + got.signum) from None
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def cell_spec(study: Study, arm: str, env: str, seed: int) -> RunSpec:
    """One cell as a single run."""
    a = study.arms[arm]
    configs = [str(study.resolve(c)) for c in (*study.base, *a.configs)]
    return RunSpec.from_settings(configs, {**study.fit, **a.fit, **shared_unused(study, arm),
                                           "trainer.enable_progress_bar": False},
                                 env=env, seed=seed, frames=study.frames)


def shared_unused(study: Study, arm: str) -> dict[str, Any]:
    """The loss settings the study's shared ``fit:`` or its base configs give an arm whose objective
    ignores them (`ppo_lightning.algos.registry.unused_settings`: another value than the default), as
    ``{option: default}``: the arm's runs take the default, which trains the same, and `check_study`
    names them in a warning. A single run refuses such a setting; one shared by arms of different
    objectives belongs to some of them. (The arm's own ``fit`` is not shared: its runs refuse it. An
    objective given by import path and not imported yet is left to its runs.)"""
    a = study.arms[arm]
    cfg = merge_configs([study.resolve(c) for c in (*study.base, *a.configs)]).get("model", {})
    fit = {**study.fit, **a.fit}
    unused = objective_settings_unused(fit.get("model.objective", cfg.get("objective", "clip")))
    out = {}
    for setting in unused or ():
        key = f"model.{setting}"
        if key in a.fit:
            continue
        value, default = fit.get(key, cfg.get(setting, OBJECTIVE_DEFAULTS[setting])), OBJECTIVE_DEFAULTS[setting]
        if value != default:
            out[key] = default
    return out


# The defaults of the loss settings an objective may ignore (`ppo_lightning.algos.loss.LossSettings`'s;
# tests/test_studies.py checks them against it).
OBJECTIVE_DEFAULTS = {"clip_eps": 0.2, "kl_beta": 1.0, "kl_target": 0.01, "kl_form": "analytic", "max_importance_ratio": None}


def _base_config(study: Study, arm: str) -> dict:
    return merge_configs([study.resolve(c) for c in (*study.base, *study.arms[arm].configs)])


def member_values(study: Study, arm: str) -> tuple[str, dict] | None:
    """``(shared key, the member's own settings after its --scale rules)`` for an arm that can be a
    member of a mixed group, else None (another config than the base, staleness, decoupled
    without an EWMA)."""
    a = study.arms[arm]
    if a.configs or any(k.startswith("data.staleness") for k in a.fit):
        return None
    cfg = _base_config(study, arm)
    fit = {**study.fit, **a.fit}
    get = lambda k, d=None: fit.get(k, cfg.get(k.split(".")[0], {}).get(k.split(".")[1], d) if "." in k else d)  # noqa: E731
    decoupled = bool(get("model.decoupled", False))
    com = get("model.proximal_com")
    if decoupled and com is None:
        return None
    values = {"lr": float(get("model.lr")), "proximal_com": float(com) if decoupled else None,
              "advantage_norm_span": float(get("data.advantage_norm_span", 1.0)),
              "adam_betas": [float(b) for b in (get("model.adam_betas") or ADAM_BETAS)],
              **{k.split(".")[1]: float(get(k, d)) for k, d in LOSS_AND_RETURN_KEYS.items()}}
    c = float(fit.get("scale") or 1.0)
    shared = {k: v for k, v in fit.items() if k not in MEMBER_KEYS}
    scaled = scale_member_settings(c, values, str(fit.get("scale_rules", "all")), bool(fit.get("scale_adam_betas", False)))
    return json.dumps(shared, sort_keys=True), scaled


@dataclass
class Group:
    """Cells that train as one process: ``members`` (arm, seed) on ``env``, the run that trains them and
    its estimated training time in seconds of one core (`group_cost`)."""
    env: str
    members: list[tuple[str, int]]
    spec: RunSpec
    cost: float = float("nan")

    @property
    def name(self) -> str:
        h = hashlib.sha1(json.dumps([self.env, self.members, self.spec.argv()]).encode()).hexdigest()[:10]
        return f"{self.env.replace(':', '-')}-{len(self.members)}m-{h}"


def group_spec(study: Study, env: str, members: list[tuple[str, int]]) -> RunSpec:
    """The run of a group: one arm's seeds as members, or several arms' (their settings per member)."""
    arms = list(dict.fromkeys(a for a, _ in members))
    seeds = [s for _, s in members]
    if len(arms) == 1:
        return cell_spec(study, arms[0], env, seeds[0]).replace(members=Members(seeds))
    specs = {a: member_values(study, a)[1] for a in arms}
    own = [k.split(".")[1] for k in LOSS_AND_RETURN_KEYS if any(k in study.arms[a].fit for a in arms)]  # set by an arm
    values = {n: [specs[a][n] for a, _ in members] for n in (*ALWAYS_MEMBER_SETTINGS, *own)}
    if all(v is None for v in values["proximal_com"]):
        del values["proximal_com"]
    if all(list(v) == ADAM_BETAS for v in values["adam_betas"]):
        del values["adam_betas"]
    # the shared options (those of the first arm without its member settings), the members' own values in full
    first = study.arms[arms[0]]
    shared_fit = {k: v for k, v in first.fit.items() if k not in MEMBER_KEYS}
    configs = [str(study.resolve(c)) for c in study.base]
    ewma = {"model.decoupled": True, "model.proximal_com": 8} if "proximal_com" in values else {}
    shared_fit.update(shared_unused(study, arms[0]))  # the members share their objective (it is not a member setting)
    # the members' values are scaled already (`member_values`): the group applies no --scale rule of its own
    return RunSpec.from_settings(configs, {**study.fit, **shared_fit, **ewma, "scale_rules": "none",
                                           "trainer.enable_progress_bar": False},
                                 env=env, seed=seeds[0], frames=study.frames, members=Members(seeds, values))


# ----------------------------------------------------------------------------------- planning
# A group's time: rate x frames x (members + GROUP_OVERHEAD). The overhead, in members, is what a group
# costs besides its members (its Python loop per iteration, the optimizer's and the loss's calls):
# packing m members into one group costs m + GROUP_OVERHEAD member-units where m single runs cost
# m (1 + GROUP_OVERHEAD), and splitting a group costs GROUP_OVERHEAD more. Measured at c = 16 (Breakout,
# 16k frames, docs/guides/tuning.md: 8 packed trials at 8.8 CPU s each against 20.9 alone, 16 at 6.2
# against 17.8) it is about 2; a group at c = 1 does more work per member and iteration, so less. 1 is
# the rough value the planner uses.
GROUP_OVERHEAD = 1.0
# seconds of one core per member-unit and frame, and the games' relative costs, where a study has no
# recorded cell to measure them: MinAtar at the base configuration, 32-true, one thread, groups of 8
# members, 100k frames (benchmarks/study_workers.py on a 2-core AMD EPYC with AVX2, 2026-12-03:
# Breakout 136 s, SpaceInvaders 210 s); other games count as Breakout.
DEFAULT_RATE_S = 136.0 / (100_000 * (8 + GROUP_OVERHEAD))
DEFAULT_ENV_COST = {"minatar:breakout": 1.0, "minatar:space_invaders": 210.0 / 136.0}
MIN_GAIN = 0.01  # a split must shorten the makespan by 1% at least


def group_cost(members: int, frames: int, rate: float, overhead: float = GROUP_OVERHEAD) -> float:
    """Seconds of one core a group of ``members`` takes for ``frames`` frames per member."""
    return rate * frames * (members + overhead)


def lpt(costs: list[float], workers: int) -> list[list[int]]:
    """Longest processing time first: the indices of ``costs``, longest first, each to the least loaded
    of ``workers`` workers (ties: the lowest worker). Workers left without one are dropped."""
    bins: list[list[int]] = [[] for _ in range(max(1, workers))]
    loads = [0.0] * len(bins)
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        w = min(range(len(bins)), key=lambda w: (loads[w], w))
        bins[w].append(i)
        loads[w] += costs[i]
    return [b for b in bins if b]


def worker_loads(costs: list[float], workers: int) -> list[float]:
    """Every worker's time when `lpt` deals ``costs``, longest first (idle workers as 0)."""
    loads = sorted((sum(costs[i] for i in b) for b in lpt(costs, workers)), reverse=True)
    return loads + [0.0] * (max(1, workers) - len(loads))


def makespan(costs: list[float], workers: int) -> float:
    """The longest worker's time when `lpt` deals ``costs`` to ``workers`` workers."""
    return worker_loads(costs, workers)[0]


def _shorter(a: list[float], b: list[float], tol: float = 1e-9) -> bool:
    """Loads ``a`` before ``b`` (both longest first): the first that differ decides."""
    for x, y in zip(a, b):
        if x < y * (1 - tol):
            return True
        if x > y * (1 + tol):
            return False
    return False


def balance(groups: list[tuple[int, float]], workers: int, overhead: float = GROUP_OVERHEAD,
            min_gain: float = MIN_GAIN) -> list[list[int]]:
    """How to split groups of ``(members, seconds per member-unit)`` (rate x frames) over ``workers``:
    the part sizes of each group, e.g. ``[[8], [7, 1]]``.

    A part's cost is ``unit x (members + overhead)``: a split pays ``overhead`` more work (the packing
    lost). Greedy: of all splits of one part in two (every size), the one whose workers' loads under
    `lpt`, longest first, come first (the makespan, then the next worker's, ...; so that splitting
    one of several equally long groups counts: the makespan falls only when all are split), while
    there is one that improves them. The answer is the plan with the shortest makespan met on the
    way, if it shortens the unsplit plan's by ``min_gain`` at least (else no split), with the fewest
    splits."""
    parts = [[m] for m, _ in groups]

    def loads(ps):
        return worker_loads([u * (n + overhead) for (_, u), sizes in zip(groups, ps) for n in sizes], workers)

    current = loads(parts)
    best, best_parts = current[0], parts
    while workers > 1:
        found = None
        for g, sizes in enumerate(parts):
            for j, n in enumerate(sizes):
                for k in range(1, n // 2 + 1):
                    trial = [list(x) for x in parts]
                    trial[g][j:j + 1] = [n - k, k]
                    vec = loads(trial)
                    if _shorter(vec, current) and (found is None or _shorter(vec, found[0])):
                        found = vec, trial
        if found is None:
            break
        current, parts = found
        if current[0] < best * (1 - min_gain):
            best, best_parts = current[0], parts
    return best_parts


def _kinds(study: Study) -> tuple[dict[str, list[str]], list[str]]:
    """Arms that can share a group (by the key of their shared settings), and arms that run seed by seed."""
    kinds: dict[str, list[str]] = {}
    single = []
    for arm in study.arms:
        spec = member_values(study, arm)
        if spec is not None:
            kinds.setdefault(spec[0], []).append(arm)
        elif any(k.startswith("data.staleness") for k in study.arms[arm].fit):
            single.append(arm)
        else:
            kinds.setdefault(f"arm:{arm}", []).append(arm)
    return kinds, single


GROUP_SIZE = re.compile(r"-(\d+)m-[0-9a-f]+$")


def unit_rates(cells, kind_of: dict[str, str], overhead: float = GROUP_OVERHEAD) -> dict[tuple[str, str], float]:
    """Seconds per member-unit and frame of the recorded groups, by ``(env, kind)`` (mean over groups),
    from cells the runner recorded (their group's training time over its members; the group's size
    from its name)."""
    by_group: dict[str, tuple[str, str, float]] = {}
    for c in cells:
        m = GROUP_SIZE.search(c.group or "")
        if m is None or c.arm not in kind_of or not (math.isfinite(c.train_s) and c.train_s > 0 and c.frames > 0):
            continue
        n = int(m.group(1))
        by_group[c.group] = (c.env, kind_of[c.arm], c.train_s * n / (c.frames * (n + overhead)))
    rates: dict[tuple[str, str], list[float]] = {}
    for env, kind, r in by_group.values():
        rates.setdefault((env, kind), []).append(r)
    return {k: sum(v) / len(v) for k, v in rates.items()}


def rate_for(env: str, kind: str, rates: dict[tuple[str, str], float]) -> float:
    """A group's seconds per member-unit and frame: its (env, kind) as recorded; else the recorded
    groups of its env; else of its kind, or of any, moved to its env by `DEFAULT_ENV_COST`; else
    `DEFAULT_RATE_S` x `DEFAULT_ENV_COST`."""
    factor = lambda e: DEFAULT_ENV_COST.get(e, 1.0)  # noqa: E731
    if (env, kind) in rates:
        return rates[(env, kind)]
    for pick in (lambda e, k: e == env, lambda e, k: k == kind, lambda e, k: True):
        found = [r / factor(e) * factor(env) for (e, k), r in rates.items() if pick(e, k)]
        if found:
            return sum(found) / len(found)
    return DEFAULT_RATE_S * factor(env)


def plan(study: Study, done: set, workers: int = 1, cells=None, envs: tuple[str, ...] | None = None,
         arms: tuple[str, ...] | None = None) -> list[Group]:
    """The groups that train the pending cells (of ``envs`` and ``arms`` only, where given: `only_envs`,
    `only_arms`), split where
    that shortens the study on ``workers`` workers (`balance`), with their estimated costs (rates from
    ``cells``, the recorded `Cell` objects, where there are any: `rate_for`)."""
    kinds, single = _kinds(study)
    kind_of = {a: k for k, arms in kinds.items() for a in arms} | {a: f"single:{a}" for a in single}
    rates = unit_rates(cells or [], kind_of)
    natural = []  # (env, members, seconds per member-unit and frame)
    wanted = set(arms or study.arms)
    for env in envs or study.envs:
        for key, packed in kinds.items():
            members = [(a, s) for a in packed if a in wanted for s in study.seeds if (a, env, s) not in done]
            if members:
                natural.append((env, members, rate_for(env, key, rates)))
        for arm in (a for a in single if a in wanted):
            natural += [(env, [(arm, s)], rate_for(env, kind_of[arm], rates)) for s in study.seeds if (arm, env, s) not in done]
    parts = balance([(len(m), r * study.frames) for _, m, r in natural], workers)
    groups = []
    for (env, members, rate), sizes in zip(natural, parts):
        at = 0
        for n in sizes:
            part = members[at:at + n]
            at += n
            groups.append(Group(env, part, group_spec(study, env, part), group_cost(n, study.frames, rate)))
    return groups


def only_envs(study: Study, names: str | None) -> tuple[str, ...] | None:
    """``study run --envs``: the study's envs named in ``names`` (comma-separated, spelled as the file
    spells them), in that order; None for all. The other envs' cells stay pending, and the records
    (the run root, the CSV export) stay the whole study's. An env the file does not have is refused."""
    if names is None:
        return None
    wanted = tuple(dict.fromkeys(e.strip() for e in names.split(",") if e.strip()))
    unknown = [e for e in wanted if e not in study.envs]
    if unknown or not wanted:
        raise ValueError(f"--envs {names!r}: {', '.join(unknown) or 'no env'} not among the study's envs "
                         f"({', '.join(study.envs)})")
    return wanted


def only_arms(study: Study, names: str | None) -> tuple[str, ...] | None:
    """``study run --arms``: the study's arms named in ``names`` (comma-separated, by their names in
    the file), None for all. As with ``--envs``, the other arms' cells stay pending and the records stay
    the whole study's; an arm the file does not have is refused."""
    if names is None:
        return None
    wanted = tuple(dict.fromkeys(a.strip() for a in names.split(",") if a.strip()))
    unknown = [a for a in wanted if a not in study.arms]
    if unknown or not wanted:
        raise ValueError(f"--arms {names!r}: {', '.join(unknown) or 'no arm'} not among the study's arms "
                         f"({', '.join(study.arms)})")
    return wanted


def deal(groups: list[Group], workers: int) -> list[list[Group]]:
    """Longest first to the least loaded worker (`lpt` on the groups' estimated costs)."""
    return [[groups[i] for i in b] for b in lpt([g.cost for g in groups], workers)] if groups else []


# ----------------------------------------------------------------------------------- records
def _cell_path(run_root: Path, arm: str, env: str, seed: int) -> Path:
    return run_root / "cells" / f"{arm}__{env.replace(':', '-')}__{seed}.json"


def recorded(run_root: Path) -> dict[tuple[str, str, int], Cell]:
    out = {}
    for p in sorted((run_root / "cells").glob("*.json")):
        d = load_json(p)
        d["curve"] = [tuple(x) for x in d["curve"]]
        c = Cell(**d)
        out[c.key] = c
    return out


def _write_json(path: Path, data, what: str = "study record") -> None:
    atomic_write(path, json.dumps(data), what)


def resume_spec(spec: RunSpec, run_dir: Path, checkpoint_frames: int | None = None) -> tuple[RunSpec, Path | None]:
    """The group's run with periodic checkpoints in ``run_dir``, and the ``last.ckpt`` to resume from when
    an attempt of the same run left one (another run's: the old folder is set aside and the group starts over)."""
    # the group's frames per iteration: its envs x steps (its own value, else its configs' last), / --scale
    cfg: dict = {}
    for c in spec.configs:
        for section, values in (load_yaml(c) or {}).items():
            if isinstance(values, dict):
                cfg.setdefault(section, {}).update(values)
    envs = float(spec.data.get("num_envs", cfg.get("data", {}).get("num_envs", 64)))
    steps = float(spec.data.get("rollout_steps", cfg.get("data", {}).get("rollout_steps", 64)))
    per_iteration = envs * steps / float(spec.options.get("scale") or 1.0)
    every = max(1, round((checkpoint_frames or CHECKPOINT_FRAMES) / per_iteration))
    args = spec.argv()
    checkpointed = spec.with_settings({"trainer.enable_checkpointing": True, "checkpoint_every": every})
    stamp, last = run_dir / "group_args.json", run_dir / "checkpoints" / "last.ckpt"
    if last.exists():
        try:
            if json.loads(stamp.read_text()) != args:
                raise ValueError("written by a run with other arguments")
            check_checkpoint_file(last)
        except Exception as err:  # noqa: BLE001 - any reason not to resume: start over, keep the old files
            aside = run_dir.with_name(f"{run_dir.name}.set-aside-{time.strftime('%Y%m%d-%H%M%S')}")
            print(f"[study] not resuming {run_dir.name} ({str(err).splitlines()[0]}); old folder: {aside}", flush=True)
            run_dir.rename(aside)
        else:
            print(f"[study] {run_dir.name}: continuing from {last}", flush=True)
            return checkpointed, last
    run_dir.mkdir(parents=True, exist_ok=True)
    _write_json(stamp, args, "the group's arguments")
    return checkpointed, None


def attempt_train_times(history: list[tuple[int, int, float]]) -> list[float]:
    """Training time of each attempt of a run from its ``time/elapsed_s`` history ``[(timestamp, step,
    value)]``: an attempt (a process; a resumed one continues the run from its last checkpoint) restarts
    the clock and the steps, so a step or a value that does not grow starts a new attempt; an attempt's
    time is its last value."""
    out: list[float] = []
    prev = None
    for _, step, v in sorted(history):
        if prev is None or step <= prev[0] or v < prev[1]:
            out.append(v)
        else:
            out[-1] = v
        prev = step, v
    return out


def _elapsed_history(client, run_id: str) -> list[tuple[int, int, float]]:
    return [(m.timestamp, m.step, m.value) for m in client.get_metric_history(run_id, "time/elapsed_s")]


def group_lock(run_root: Path, name: str) -> int | None:
    """An exclusive lock on ``<run root>/groups/<name>.lock`` (`fcntl.flock`, held until its descriptor is
    closed or the process ends, SIGKILL included): its descriptor, or None while another process holds
    it. Two processes never train one group at once (a rerun while a killed launcher's jobs still run,
    a job requeued while its old one is ending); the file names the holder."""
    path = run_root / "groups" / f"{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = open_nofollow(path, os.O_CREAT | os.O_RDWR, "the group's lock file")  # a planted link: refused
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps({"host": socket.gethostname(), "pid": os.getpid()}).encode())
    return fd


def run_group(study: Study, group: Group, run_root: Path, tracking_uri: str, parent_run_id: str | None = None,
              checkpoint_frames: int | None = None) -> list[Cell]:
    """Train one group in this process and record its cells (skipped when all are recorded; left alone,
    returning no cell, while another process holds its `group_lock`)."""
    have = recorded(run_root)
    if all((a, group.env, s) in have for a, s in group.members):
        return [have[(a, group.env, s)] for a, s in group.members]
    lock = group_lock(run_root, group.name)
    if lock is None:
        holder = (run_root / "groups" / f"{group.name}.lock").read_text() or "?"
        print(f"[study] {group.name}: another process trains it now ({holder}); left to it", flush=True)
        return []
    try:
        return _train_group(study, group, run_root, tracking_uri, parent_run_id, checkpoint_frames)
    finally:
        os.close(lock)


def _train_group(study: Study, group: Group, run_root: Path, tracking_uri: str, parent_run_id: str | None,
                 checkpoint_frames: int | None) -> list[Cell]:
    """`run_group`'s training and records, under the group's lock."""
    run_dir = run_root / "groups" / group.name
    spec, last = resume_spec(group.spec, run_dir, checkpoint_frames)
    _write_json(run_dir / "members.json", {"env": group.env, "members": group.members})  # for `study status`
    attempts_file = run_dir / "attempts.json"  # earlier attempts of this group, stopped (preempted) before the end
    earlier = json.loads(attempts_file.read_text()) if attempts_file.exists() else []
    t0 = time.perf_counter()
    spec = spec.with_settings({"mlflow.tracking_uri": tracking_uri, "mlflow.experiment": study.name,
                               "mlflow.run_name": group.name, "run_dir": str(run_dir)})
    run = train(spec.replace(callbacks=(*spec.callbacks, PROGRESS_CALLBACK)), ckpt_path=last)
    code = run.exit_code
    wall = time.perf_counter() - t0
    if code:  # stopped by a signal (preemption): resumable from its checkpoint; its time is kept for the cells
        try:
            logger = run.trainer.logger
            segments = attempt_train_times(_elapsed_history(logger.experiment, logger.run_id))
        except Exception:  # noqa: BLE001 - the tracking store may be away: the wall time stands for it
            segments = []
        _write_json(attempts_file, [*earlier, {"wall_s": wall, "train_s": segments[-1] if segments else wall}])
        raise SystemExit(code)
    logger = run.trainer.logger
    client, frames = logger.experiment, run.frames
    segments = attempt_train_times(_elapsed_history(client, logger.run_id)) or [wall]
    # every attempt: the earlier ones recorded, any killed without a record (SIGKILL: only their elapsed
    # time in a run the attempts shared), and this one
    unrecorded = segments[len(earlier):-1]
    attempts = len(earlier) + len(unrecorded) + 1
    train_s = sum(a["train_s"] for a in earlier) + sum(unrecorded) + segments[-1]
    wall = sum(a["wall_s"] for a in earlier) + sum(unrecorded) + wall
    precision = run.precision
    cpu = cpu_label()
    if parent_run_id:
        client.set_tag(logger.run_id, "mlflow.parentRunId", parent_run_id)
    run_ids = run.model.member_run_ids or [logger.run_id]
    cells = []
    for (arm, seed), run_id in zip(group.members, run_ids):
        hist = lambda key: {m.step: m.value for m in client.get_metric_history(run_id, key)}  # noqa: E731
        fr, rets = hist("frames"), hist("episode/return_mean20")
        curve = sorted((fr[k], r) for k, r in rets.items() if k in fr)
        last100 = [v for _, v in sorted(hist("episode/return_mean100").items())]  # the PPO paper's score
        cell = Cell(arm, group.env, seed, int(frames), curve_auc(curve, frames), final_value(curve, frames), cpu,
                    precision, wall / len(group.members), train_s / len(group.members), group.name, run_id, "run", curve,
                    attempts, last100[-1] if last100 else float("nan"))
        for k, v in {"study": study.name, "arm": arm, "env": group.env, "seed": seed, "cpu": cpu, "precision": precision,
                     "label": study.arms[arm].label}.items():
            client.set_tag(run_id, k, str(v))
        _write_json(_cell_path(run_root, arm, group.env, seed), asdict(cell), "the cell record")
        cells.append(cell)
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    return cells


class Worker:
    """One submitit job: its groups one after the other. On SLURM, a preempted job is requeued by
    submitit (`checkpoint`) and runs them again: recorded groups are skipped, the interrupted one
    resumes from its checkpoint."""

    def __init__(self, study_path: str, groups: list[Group], run_root: str, tracking_uri: str, parent: str | None,
                 checkpoint_frames: int | None = None) -> None:
        self.study_path, self.groups, self.run_root, self.tracking_uri, self.parent = study_path, groups, run_root, tracking_uri, parent
        self.checkpoint_frames = checkpoint_frames

    def __call__(self) -> int:
        study = load_study(self.study_path)
        if self.parent is None:  # the study's parent run, made by the first worker (it imports MLflow anyway)
            self.parent = _parent_run(study, self.tracking_uri, Path(self.run_root))
        for g in self.groups:
            run_group(study, g, Path(self.run_root), self.tracking_uri, self.parent, self.checkpoint_frames)
        return len(self.groups)

    def checkpoint(self, *args, **kwargs):
        import submitit

        return submitit.helpers.DelayedSubmission(Worker(self.study_path, self.groups, self.run_root, self.tracking_uri,
                                                         self.parent, self.checkpoint_frames))


# the callback a group trains with so that the launcher can show its progress (not part of the group's
# arguments: the group's name, a hash of them, stays the same)
PROGRESS_CALLBACK = "ppo_lightning.training.callbacks.ProgressFile"


def _bar(fraction: float, width: int = 20) -> str:
    n = max(0, min(width, round(fraction * width)))
    return "[" + "#" * n + "." * (width - n) + "]"


def _mframes(n: float) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1e5 else f"{n / 1e3:.1f}k"


def _duration(s: float) -> str:
    return f"{s / 3600:.1f} h" if s >= 5400 else f"{s / 60:.0f} min" if s >= 90 else f"{s:.0f} s"


def progress_lines(study: Study, run_root: Path, bins: list[list[Group]]) -> list[str]:
    """One line per worker: its member-frames done over its groups' total (recorded groups whole, the
    running one from its ``progress.json``), a bar, and the time left at the running group's rate
    (member-frames per second in this attempt)."""
    have = recorded(run_root)
    lines = []
    for i, groups in enumerate(bins):
        total = sum(len(g.members) * study.frames for g in groups)
        done, rate = 0.0, None
        for g in groups:
            if all((a, g.env, s) in have for a, s in g.members):
                done += len(g.members) * study.frames
                continue
            try:
                p = json.loads((run_root / "groups" / g.name / "progress.json").read_text())
            except (OSError, ValueError):
                continue
            done += min(p["frames"], study.frames) * len(g.members)
            if p.get("attempt_s", 0) > 0 and p.get("attempt_frames", 0) > 0:
                rate = p["attempt_frames"] * len(g.members) / p["attempt_s"]
        frac = done / total if total else 1.0
        left = "done" if done >= total else (f"~{_duration((total - done) / rate)} left" if rate else "starting")
        lines.append(f"worker {i + 1}: {_bar(frac)} {_mframes(done)}/{_mframes(total)} member-frames ({frac:.0%}), {left}")
    return lines


def _failing_group(groups: list[Group], run_root: Path) -> str | None:
    """What a failed worker was training: its first group with a cell not recorded, and that group's arms."""
    have = recorded(run_root)
    for g in groups:
        if not all((a, g.env, s) in have for a, s in g.members):
            arms = ", ".join(dict.fromkeys(a for a, _ in g.members))
            return f"arm{'s' if ',' in arms else ''} {arms} on {g.env}, group {g.name}"
    return None


def default_run_root(study: Study) -> Path:
    return study.root / "runs" / "studies" / study.name


def done_cells(study: Study, run_root: Path) -> dict:
    cells = legacy_cells(study)
    cells.update(export_cells(study))
    cells.update({k: v for k, v in recorded(run_root).items() if k[0] in study.arms and k[1] in study.envs})
    return cells


def _parent_run(study: Study, tracking_uri: str, run_root: Path) -> str | None:
    """The study's MLflow parent run: found by its tag, else made (one at a time: the workers of a
    study take a lock in its run root)."""
    lock = open_nofollow(run_root / ".parent-run.lock", os.O_CREAT | os.O_RDWR, "the study's lock file")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _find_or_make_parent_run(study, tracking_uri, run_root)
    finally:
        os.close(lock)


def _find_or_make_parent_run(study: Study, tracking_uri: str, run_root: Path | None = None) -> str | None:
    try:
        from mlflow.tracking import MlflowClient

        # a new experiment keeps its artifacts in the run root, not in ./mlruns of the working directory
        local = run_root is not None and tracking_uri.startswith("sqlite:")  # a server keeps its own artifact root
        probe_tracking_store(tracking_uri, study.name,
                             artifact_location=(Path(run_root) / "mlruns").resolve().as_uri() if local else None)
        client = MlflowClient(tracking_uri)
        exp = client.get_experiment_by_name(study.name)
        found = client.search_runs([exp.experiment_id], filter_string="tags.study_parent = 'true'")
        if found:  # a rerun's workers: RUNNING again until the launcher ends it (`end_parent_run`)
            client.update_run(found[0].info.run_id, status="RUNNING")
            return found[0].info.run_id
        run = client.create_run(exp.experiment_id, run_name=study.name, tags={"study_parent": "true", "study": study.name,
                                                                              "study_file": str(study.path)})
        client.log_dict(run.info.run_id, json.loads(json.dumps(load_yaml(study.path))), "study.json")
        return run.info.run_id
    except Exception as err:  # noqa: BLE001 - records still go to the cell files and the CSV export
        print(f"[study] MLflow parent run not made ({str(err).splitlines()[0]}); cells are recorded in files", flush=True)
        return None


class _EndParentOnStop(contextlib.AbstractContextManager):
    """A launcher stopped by a signal (SystemExit from `jobs_stop_with_the_launcher`) ends the parent
    run KILLED, with the cells still missing."""

    def __init__(self, study: Study, run_root: Path, tracking_uri: str) -> None:
        self.study, self.run_root, self.tracking_uri = study, run_root, tracking_uri

    def __exit__(self, kind, err, tb) -> None:
        if kind is SystemExit:
            done = done_cells(self.study, self.run_root)
            end_parent_run(self.study, self.tracking_uri, "KILLED", [c for c in self.study.cells() if c not in done])


def end_parent_run(study: Study, tracking_uri: str, status: str, missing: list[tuple[str, str, int]]) -> None:
    """Ends the study's MLflow parent run (if a worker made one): FINISHED when every cell is recorded,
    else ``status`` (FAILED, or KILLED when the launcher was stopped) with the missing cells in a tag
    (a rerun that finishes them ends it FINISHED)."""
    try:
        from mlflow.tracking import MlflowClient  # start-up cost: MLflow once, at the launcher's end

        client = MlflowClient(tracking_uri)
        exp = client.get_experiment_by_name(study.name)
        if exp is None:
            return
        for run in client.search_runs([exp.experiment_id], filter_string="tags.study_parent = 'true'"):
            if missing:
                shown = ", ".join(f"{a}/{e}/{s}" for a, e, s in missing[:20]) + (" ..." if len(missing) > 20 else "")
                client.set_tag(run.info.run_id, "missing_cells", f"{len(missing)}: {shown}")
            elif "missing_cells" in run.data.tags:
                client.delete_tag(run.info.run_id, "missing_cells")
            client.set_terminated(run.info.run_id, "FINISHED" if not missing else status)
    except Exception as err:  # noqa: BLE001 - the records are in the cell files whatever the tracking store does
        print(f"[study] MLflow parent run not ended ({str(err).splitlines()[0]})", flush=True)


def executor_cluster(executor: str) -> str:
    """submitit's cluster for ``--executor``: ``local`` or ``slurm`` as given; ``auto`` is ``slurm`` only
    where a SLURM controller answers (``sinfo`` within 10 s), else ``local``. (submitit's own auto
    picks SLURM wherever ``srun`` is installed: with the tools present and no controller running, every
    job was refused.)"""
    if executor != "auto":
        return executor
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        return "local"
    try:
        answered = subprocess.run(["sinfo", "-h", "-o", "%a"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        answered = False
    if not answered:
        print("[study] --executor auto: SLURM's tools are installed but its controller does not answer; "
              "running the jobs as local processes", flush=True)
    return "slurm" if answered else "local"


def run_study(study: Study, workers: int | None = None, executor: str = "auto", run_root: Path | None = None,
              tracking_uri: str | None = None, poll_s: float = 5.0, checkpoint_frames: int | None = None,
              progress_s: float = 60.0, envs: tuple[str, ...] | None = None, arms: tuple[str, ...] | None = None) -> int:
    import submitit

    run_root = (run_root or default_run_root(study)).resolve()
    run_root.mkdir(parents=True, exist_ok=True)
    tracking_uri = tracking_uri or f"sqlite:///{run_root / 'mlflow.db'}"
    if workers is None:
        workers = int(os.environ.get("SLURM_NTASKS", core_count()))
    t0 = time.perf_counter()
    done = done_cells(study, run_root)
    groups = plan(study, set(done), workers, done.values(), envs, arms)
    total = len(study.cells())
    print(f"[study] {study.name}: {len(done)} of {total} cells recorded; {sum(len(g.members) for g in groups)} to run "
          f"in {len(groups)} groups on {workers} worker(s)", flush=True)
    if groups:
        bins = deal(groups, workers)
        ex = submitit.AutoExecutor(folder=run_root / "submitit", cluster=executor_cluster(executor))
        ex.update_parameters(timeout_min=60 * 24 * 3, cpus_per_task=1, name=study.name)
        if ex.cluster == "slurm":
            ex.update_parameters(slurm_array_parallelism=workers, slurm_additional_parameters={"requeue": True})
        planning_s = time.perf_counter() - t0
        try:
            jobs = submit_jobs(ex, [Worker(str(study.path), b, str(run_root), tracking_uri, None, checkpoint_frames)
                                    for b in bins])
        except SubmissionFailed as err:
            print(f"[study] error: {err}", flush=True)
            return 2
        start, last, shown = time.perf_counter(), -1, -float("inf")
        stopped = _EndParentOnStop(study, run_root, tracking_uri)
        with stopped, jobs_stop_with_the_launcher(jobs, "study", f"`ppo-lightning study run {study.path}`"):
            while not all(j.done() for j in jobs):
                n = len(recorded(run_root))
                if n != last or time.perf_counter() - shown >= progress_s:  # a cell recorded, or every progress_s
                    print(f"[study] {status_line(study, run_root, start)}", flush=True)
                    for line in progress_lines(study, run_root, bins):
                        print(f"[study]   {line}", flush=True)
                    last, shown = n, time.perf_counter()
                time.sleep(poll_s)
        failed = job_failures(jobs, lambda i: _failing_group(bins[i], run_root))
        t1 = time.perf_counter()
        overhead = planning_s
    else:
        t1, overhead, failed = time.perf_counter(), time.perf_counter() - t0, []
    have = recorded(run_root)
    busy = [k for g in groups for a, s in g.members if (k := (a, g.env, s)) not in have]
    left_to_others = bool(busy) and not failed  # groups another process holds (`group_lock`): not a failure
    if left_to_others:
        print(f"[study] {len(busy)} cells left to another process that trains their groups now (a second `study run` "
              f"on this run root, or a stopped launcher's job): that process records them", flush=True)
    mine = {k: c for k, c in have.items() if c.arm in study.arms and c.env in study.envs}
    if mine:  # the CSV export next to the study file: its own cells (committed records stay where they are)
        cells = export_cells(study, curves=True)
        cells.update(mine)
        write_export(study, list(cells.values()))
        compute = sum(c.train_s for c in mine.values() if math.isfinite(c.train_s))
        overhead += time.perf_counter() - t1
        print(f"[study] {study.name}: {len(cells)} cells in {study.cells_csv.name}; runner overhead {overhead:.1f} s "
              f"(planning + records) against {compute:.0f} s of training", flush=True)
    missing = [c for c in study.cells() if c not in done_cells(study, run_root)]
    if not left_to_others and (failed or not (envs or arms)
                               or any((not envs or c[1] in envs) and (not arms or c[0] in arms) for c in missing)):
        end_parent_run(study, tracking_uri, "FAILED", missing)
    # else the study's parent run stays open: for the process training the groups left to it, or (--envs /
    # --arms, all of theirs recorded) for the other cells
    if failed:
        print("[study] failed: " + "; ".join(failed) + f"; the recorded cells are kept: rerun `ppo-lightning study run "
              f"{study.path}` to train the others", flush=True)
        return 1
    return 0


def status_line(study: Study, run_root: Path, since: float | None = None) -> str:
    done = done_cells(study, run_root)
    total = len(study.cells())
    mine = [c for c in recorded(run_root).values() if math.isfinite(c.train_s)]
    line = f"{len(done)}/{total} cells done"
    if since is not None and mine:
        line += f", {time.perf_counter() - since:.0f} s"
    return line


def status_text(study: Study, run_root: Path | None = None, workers: int | None = None,
                envs: tuple[str, ...] | None = None, arms: tuple[str, ...] | None = None) -> str:
    """Done / running / pending cells, and the time left: the groups `plan` makes of the cells not
    done (of ``envs`` and ``arms`` only, where given), at the rates of the recorded cells (else the defaults), in
    one core's time and on ``workers`` workers (default: the CPU count, or SLURM's)."""
    run_root = (run_root or default_run_root(study)).resolve()
    done = done_cells(study, run_root)
    running = set()  # members of groups that have started (checkpoints) and are not recorded: running or interrupted
    for stamp in sorted((run_root / "groups").glob("*/members.json")):
        if (stamp.parent / "checkpoints").exists():
            d = json.loads(stamp.read_text())
            running |= {(a, d["env"], s) for a, s in d["members"] if (a, d["env"], s) not in done}
    pending = [c for c in study.cells() if c not in done and c not in running]
    lines = [f"{study.name}: {len(done)} done, {len(running)} running (or interrupted: a rerun resumes them), "
             f"{len(pending)} pending of {len(study.cells())} cells"]
    if pending or running:
        workers = workers or int(os.environ.get("SLURM_NTASKS", core_count()))
        core = sum(g.cost for g in plan(study, set(done), 1, done.values(), envs, arms))
        span = makespan([g.cost for g in plan(study, set(done), workers, done.values(), envs, arms)], workers)
        basis = ("the recorded groups' rates" if unit_rates(done.values(), {a: a for a in study.arms})
                 else "the default rates: no group recorded by the runner")
        which = [", ".join(x) for x in (envs, arms) if x]
        lines.append(f"time left{' for ' + ' x '.join(which) if which else ''}: ~{core / 3600:.2f} h of one core, "
                     f"~{span / 3600:.2f} h on {workers} worker(s) (at {basis}; a running group counts whole)")
    for arm in study.arms:
        n = sum(1 for c in done if c[0] == arm)
        lines.append(f"  {study.arms[arm].label}: {n}/{len(study.envs) * len(study.seeds)} done")
    return "\n".join(lines)
