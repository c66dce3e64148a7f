"""The search's worker: Optuna's ask-and-tell around vectorized groups whose members are trials.

A worker asks for as many trials as a group holds (``members / seeds.count``), samples each one's
settings, and trains them as groups: member k of a group is one seed of one trial, with that
trial's lr, EWMA age (or PPO), advantage span, Adam betas and the searched loss and return settings
(clip range, entropy and value coefficients, KL beta, gamma, GAE lambda; ``data.member_seeds``,
``data.member_hparams``; each member is its single run, `tests/test_group_members.py`). Trials
asked together that differ in a setting a member cannot carry (the network, num_envs, the
minibatches) split into one group per value, and the worker says so in one line. When a trial has
trained its frames it is told its objective: the mean over its seeds of the normalized AUC or final
return of its learning curve (`ppo_lightning.studies.records`). With a pruner, each trial reports
the objective so far at every milestone (its own frames) and is told PRUNED when Optuna says so. A
pruned or finished trial's slots take the next asked trial, which starts there afresh (weights,
Adam state and step count, EWMA, normalizers, envs, episode statistics: each refilled member is its
trial's single run; on an lr schedule each member anneals over its trial's frames from its own
start); a group stops when no slot holds a trial. The space's ``refill: false`` (``--no-refill``)
leaves freed slots idle; a PPG group (one trial's seeds) is never refilled.

Storage: Optuna's `JournalStorage` on a `JournalFileBackend` (an append-only file with a lock file
beside it) in the run root. Any number of workers on machines that share the folder (NFS, Lustre)
work on one study with no server to keep up; SQLite's locking is unreliable on network
filesystems and a PostgreSQL server is one more service every node must reach.

Resume: every worker keeps a lease file (``<run root>/workers/<id>.json``, its host, pid and a
heartbeat time refreshed every `HEARTBEAT_S`) and tags its trials with its id. A RUNNING trial whose
worker is gone (its process ended on this host, or its heartbeat is older than ``stale_after``
seconds) is failed and its settings enqueued, so the next ask trains it again; finished trials stay
in the journal. A worker that stops (a signal, an error, Ctrl-C) hands back the trials it asked and
did not tell at once (`hand_back`). Groups are not checkpointed: an unfinished trial, refilled or
not, is trained again from its start under a new number (``retry_of``). Journal storage has no
heartbeat of Optuna's own (only `RDBStorage` has), hence the lease.

Records: one MLflow parent run per search (experiment = the search's name) and one run per trial
under it, with its settings, objective, per-seed objectives, state and learning curve (a trial
that refilled a slot: its own run, tagged ``slot`` and ``refill_of``).
"""

from __future__ import annotations

import json
import math
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from ppo_lightning.core.storage import atomic_replace
from ppo_lightning.core.members import BY_NAME, OPTIONAL_MEMBER_OPTIONS, member_metric
from ppo_lightning.studies.records import curve_auc, final_value
from ppo_lightning.run.harness import normalized_return, probe_tracking_store, scale_member_settings
from ppo_lightning.run.spec import Members, RunSpec, train
from ppo_lightning.tuning.space import MEMBER_PARAMS, Space

# searched fit options a member carries besides the lr, the EWMA age, the advantage span and Adam's betas
LOSS_AND_RETURN_PARAMS = tuple(OPTIONAL_MEMBER_OPTIONS)
HEARTBEAT_S = 10.0
STALE_AFTER_S = 120.0


# ----------------------------------------------------------------------------------- objective
def score_curve(space: Space, curve: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """A raw learning curve in the objective's score (MinAtar: normalized return)."""
    if space.score == "raw":
        return list(curve)

    game = space.env.split(":", 1)[1]
    return [(f, normalized_return(game, r)) for f, r in curve]


def objective(space: Space, curves: list[list[tuple[float, float]]], total: float) -> tuple[float, list[float]]:
    """(mean over the trial's seeds, per seed) of the AUC or final value of each seed's curve
    over ``[0, total]`` frames (points past ``total`` are left out)."""
    per_seed = []
    for curve in curves:
        pts = [(f, v) for f, v in score_curve(space, curve) if f <= total]
        per_seed.append(curve_auc(pts, total) if space.metric == "auc" else final_value(pts, total))
    finite = [v for v in per_seed if math.isfinite(v)]
    return (sum(finite) / len(finite) if len(finite) == len(per_seed) and finite else float("nan")), per_seed


# ----------------------------------------------------------------------------------- groups


def split_params(space: Space, params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(member-carried settings, group settings) of a trial's sampled values."""
    member = {k: v for k, v in params.items() if space.params[k].member}
    group = {k: v for k, v in params.items() if not space.params[k].member}
    return member, group


def member_values(space: Space, params: dict[str, Any]) -> dict[str, Any]:
    """A trial's member settings (``MEMBER_SETTINGS`` names), from its values, the fit and the base,
    before the ``--scale`` rules: lr, the advantage span, the EWMA's center of mass where decoupled
    (None: PPO), Adam's betas where given, and the loss's and returns' settings the space searches."""
    out = {name: float(space.setting(BY_NAME[name].option, params, BY_NAME[name].default))  # the module's defaults
           for name in ("lr", "advantage_norm_span")}
    if space.setting("model.decoupled", params, False):
        com = space.setting("model.proximal_com", params)
        out["proximal_com"] = None if com is None else float(com)
    betas = space.setting("model.adam_betas", params)
    if betas is not None:
        out["adam_betas"] = [float(b) for b in betas]
    for name in LOSS_AND_RETURN_PARAMS:  # carried where the space searches them (else the group's value is theirs)
        if name in space.params:
            out[MEMBER_PARAMS[name]] = float(params[name])
    return out


def scaled(space: Space, values: dict[str, Any]) -> dict[str, Any]:
    """A member's settings after the search's ``--scale`` rules, as a single run with them scales its own."""

    c = float(space.setting("scale") or 1.0)
    return scale_member_settings(c, values, str(space.setting("scale_rules") or "all"),
                                 bool(space.setting("scale_adam_betas") or False))


def trial_fit(space: Space, params: dict[str, Any]) -> dict[str, Any]:
    """The fit options that train a trial as a single run: the space's fit, then its values."""
    return {**space.fit, **params}


def single_spec(space: Space, params: dict[str, Any], seed: int) -> RunSpec:
    """One trial with one seed as a single run."""
    return RunSpec.from_settings([str(space.resolve(c)) for c in space.base], trial_fit(space, params),
                                 env=space.env, seed=seed, frames=space.frames)


def group_spec(space: Space, members: list[tuple[dict[str, Any], int]], refill: bool = False) -> RunSpec:
    """The run of a group of ``(trial values, seed)`` members that share their group settings
    (``refill``: always with every member's settings, so that a slot can take another trial's)."""
    seeds = [s for _, s in members]
    if len(members) == 1:
        return single_spec(space, *members[0])
    if not refill and all(p == members[0][0] for p, _ in members):  # one trial's seeds: a plain seed group
        return single_spec(space, members[0][0], seeds[0]).replace(members=Members(seeds))
    _, shared = split_params(space, members[0][0])
    values = [scaled(space, member_values(space, p)) for p, _ in members]
    names = list(values[0])
    hparams = {n: [v[n] for v in values] for n in names}
    ewma = {"model.proximal_com": 8.0} if "proximal_com" in hparams else {}  # a placeholder: the members' values rule
    # the members' values are scaled already (`scaled`): the group applies no --scale rule of its own
    return RunSpec.from_settings([str(space.resolve(c)) for c in space.base],
                                 {**space.fit, **shared, **ewma, "scale_rules": "none"},
                                 env=space.env, seed=seeds[0], frames=space.frames, members=Members(seeds, hparams))


def plan_groups(space: Space, asked: list[tuple[Any, dict[str, Any]]]) -> list[list[tuple[Any, dict[str, Any]]]]:
    """Trials ``(trial, values)`` asked together, in groups of equal group settings (asked order kept)."""
    groups: dict[str, list] = {}
    for trial, params in asked:
        key = json.dumps(split_params(space, params)[1], sort_keys=True)
        groups.setdefault(key, []).append((trial, params))
    return list(groups.values())


# ----------------------------------------------------------------------------------- storage and leases
def journal_path(run_root: Path) -> Path:
    return run_root / "journal.log"


def journal(storage: Path) -> JournalStorage:
    """Optuna's storage on the journal file ``storage`` (its folder made on first use)."""
    storage.parent.mkdir(parents=True, exist_ok=True)
    return JournalStorage(JournalFileBackend(str(storage)))


def open_study(space: Space, storage: Path | JournalStorage, seed_offset: int = 0):
    """The search's Optuna study on its journal (a file, or `journal`'s storage of one): created on
    first use, loaded after."""

    backend = journal(storage) if isinstance(storage, Path) else storage
    seed = space.sampler_seed + seed_offset
    sampler = (optuna.samplers.TPESampler(seed=seed, constant_liar=True, n_startup_trials=min(10, space.trials))
               if space.sampler == "tpe" else optuna.samplers.RandomSampler(seed=seed))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(study_name=space.name, storage=backend, load_if_exists=True, direction="maximize",
                               sampler=sampler, pruner=space.pruner.make())


class Lease:
    """``<run root>/workers/<id>.json``: this worker's host, pid and heartbeat, refreshed by a thread."""

    def __init__(self, run_root: Path, worker_id: str | None = None, heartbeat_s: float = HEARTBEAT_S) -> None:
        self.id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.path = run_root / "workers" / f"{self.id}.json"
        self.heartbeat_s = heartbeat_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self) -> None:
        beat = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "time": time.time()})
        atomic_replace(self.path, lambda f: f.write(beat.encode()))

    def __enter__(self) -> "Lease":
        self.beat()
        self._thread = threading.Thread(target=self._run, daemon=True, name="tuning-lease")
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                self.beat()
            except OSError:
                pass

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.path.unlink(missing_ok=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def worker_gone(run_root: Path, worker: str | None, started: float | None, stale_after: float) -> bool:
    """Whether the worker that runs a trial is gone: its process ended (same host), its heartbeat is
    older than ``stale_after`` seconds, or it has no lease and the trial started that long ago."""
    now = time.time()
    path = run_root / "workers" / f"{worker}.json"
    try:
        info = json.loads(path.read_text()) if worker else None
    except (OSError, ValueError):
        info = None
    if info is None:
        return started is None or now - started > stale_after
    if info.get("host") == socket.gethostname() and not _pid_alive(int(info.get("pid", -1))):
        return True
    return now - float(info.get("time", 0)) > stale_after


def _fail_and_enqueue(study, storage: JournalStorage, t, why: str) -> bool:
    """Fail RUNNING trial ``t`` of ``study`` on ``storage`` (its ``failed_because``: ``why``) and
    enqueue its settings again, so that the next ask trains them; False when another worker has
    already failed it (and enqueued it). The storage's public methods name a trial by its id, which
    they give for the study's name and the trial's number."""

    trial_id = storage.get_trial_id_from_study_id_trial_number(storage.get_study_id_from_name(study.study_name), t.number)
    try:
        storage.set_trial_user_attr(trial_id, "failed_because", why)
        study.tell(t.number, state=TrialState.FAIL)
    except (UpdateFinishedTrialError, ValueError):  # finished by another worker meanwhile (or before this tell)
        return False
    study.enqueue_trial(dict(t.params), user_attrs={"retry_of": t.number})
    return True


def requeue_stale(study, storage: JournalStorage, run_root: Path, stale_after: float = STALE_AFTER_S,
                  me: str | None = None) -> list[int]:
    """Fail the RUNNING trials of workers that are gone and enqueue their settings again (the next
    ask trains them); returns the numbers of the trials failed here."""

    failed = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        worker = t.user_attrs.get("worker")
        if worker == me:
            continue
        started = t.datetime_start.timestamp() if t.datetime_start else None
        if not worker_gone(run_root, worker, started, stale_after):
            continue
        if _fail_and_enqueue(study, storage, t, f"worker {worker} is gone"):
            failed.append(t.number)
    if failed:
        print(f"[tune] re-asking trials {failed}: their worker is gone", flush=True)
    return failed


def hand_back(study, storage: JournalStorage, me: str) -> list[int]:
    """Fail the RUNNING trials this worker asked and did not tell (a trial stashed for the next group,
    a group's trials when it stops on an error outside its fit) and enqueue their settings again: a
    worker that stops hands them to the next ask at once, where its removed lease would leave them to
    `requeue_stale` only after ``stale_after``; returns their numbers."""

    back = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if t.user_attrs.get("worker") != me:
            continue
        if _fail_and_enqueue(study, storage, t, f"worker {me} stopped before training it"):
            back.append(t.number)
    if back:
        print(f"[tune] trials {back} handed back (asked, not trained): the next ask trains them", flush=True)
    return back


def counted(study) -> list:
    """The trials that count towards the search's size: every one not failed (a failed trial that
    was re-asked counts through its retry)."""

    return [t for t in study.get_trials(deepcopy=False) if t.state != TrialState.FAIL]


# ----------------------------------------------------------------------------------- MLflow
def parent_run(space: Space, run_root: Path, tracking_uri: str) -> str | None:
    """The search's MLflow parent run: made by the first worker (an exclusive file in the run root
    names it; the others read it)."""
    marker = run_root / "mlflow_parent.json"
    try:
        from mlflow.tracking import MlflowClient  # start-up cost: MLflow only where a search runs

        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            for _ in range(300):
                text = marker.read_text() if marker.exists() else ""
                if text:
                    return json.loads(text)["run_id"]
                time.sleep(0.1)
            return None
        local = tracking_uri.startswith("sqlite:")  # a tracking server keeps its own artifact root
        probe_tracking_store(tracking_uri, space.name,
                             artifact_location=(run_root / "mlruns").resolve().as_uri() if local else None)
        client = MlflowClient(tracking_uri)
        exp = client.get_experiment_by_name(space.name)
        run = client.create_run(exp.experiment_id, run_name=space.name,
                                tags={"tuning_parent": "true", "tuning": space.name, "space_file": str(space.path)})
        client.log_dict(run.info.run_id, json.loads(json.dumps(space.raw)), "space.json")
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps({"run_id": run.info.run_id, "tracking_uri": tracking_uri}))
        return run.info.run_id
    except Exception as err:  # noqa: BLE001 - the search's results are in the journal either way
        print(f"[tune] MLflow parent run not made ({str(err).splitlines()[0]}); trials are recorded in the journal", flush=True)
        return None


def record_trial(space: Space, tracking_uri: str, parent: str | None, trial, params: dict, state: str,
                 value: float | None, per_seed: list[float], curves: list[list[tuple[float, float]]], group: str) -> str | None:
    """One MLflow run for a trial under the search's parent run, made when the trial is told (a trial
    that refilled a slot gets its own, tagged ``slot`` and ``refill_of``, with its curve over its own
    frames); returns its id."""
    if parent is None:
        return None
    try:
        from mlflow.entities import Metric, Param, RunTag  # start-up cost: MLflow only where a search runs
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri)
        exp = client.get_experiment_by_name(space.name)
        tags = {"mlflow.parentRunId": parent, "tuning": space.name, "trial": str(trial.number), "state": state,
                "group": group}
        if "refill_of" in trial.user_attrs:  # a refilled slot's trial: its own run, naming the trial it followed there
            tags.update(slot=str(trial.user_attrs["refilled_slot"]), refill_of=str(trial.user_attrs["refill_of"]))
        run = client.create_run(exp.experiment_id, run_name=f"{space.name}-trial{trial.number}", tags=tags)
        now = int(time.time() * 1000)
        metrics = []
        if value is not None and math.isfinite(value):
            metrics.append(Metric("objective", value, now, 0))
        for k, v in enumerate(per_seed):
            if math.isfinite(v):
                metrics.append(Metric(member_metric(k, "objective"), v, now, 0))
        for k, curve in enumerate(curves):
            for f, r in curve:
                if math.isfinite(r):
                    metrics.append(Metric(member_metric(k, "episode/return_mean20"), r, now, int(f)))
        ps = [Param(k, json.dumps(v) if isinstance(v, list) else str(v)) for k, v in params.items()]
        ps += [Param("seeds", json.dumps(list(space.seeds))), Param("frames", str(space.frames))]
        for i in range(0, max(len(metrics), 1), 1000):
            client.log_batch(run.info.run_id, metrics=metrics[i:i + 1000], params=ps if i == 0 else [],
                             tags=[RunTag("metric", space.metric), RunTag("score", space.score)] if i == 0 else [])
        client.set_terminated(run.info.run_id, "FINISHED" if state != "FAIL" else "FAILED")
        return run.info.run_id
    except Exception as err:  # noqa: BLE001 - the trial's result is in the journal
        print(f"[tune] trial {trial.number}: MLflow run not made ({str(err).splitlines()[0]})", flush=True)
        return None


# ----------------------------------------------------------------------------------- the worker
def _ask(study, space: Space, me: str) -> tuple[Any, dict[str, Any]] | None:
    """One trial within the search's size, its values sampled; None when the search is full."""

    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    if len(counted(study)) >= space.trials and not waiting:
        return None
    trial = study.ask()
    mine = [t for t in counted(study) if t.number <= trial.number]
    if len(mine) > space.trials:  # another worker asked the last ones at the same moment
        trial.set_user_attr("surplus", True)
        study.tell(trial, state=TrialState.FAIL)
        return None
    trial.set_user_attr("worker", me)
    return trial, {name: p.suggest(trial) for name, p in space.params.items()}


def refillable(space: Space, members: int) -> bool:
    """Whether a pruned or finished trial's slots take the next trial: the space's ``refill`` on and a
    group (not a single run). A PPG group refills a slot where its next phase starts."""
    return space.refill and members > 1


def _next_for(study, space: Space, me: str, shared: dict[str, Any], stash: list):
    """The next trial for a freed slot of a group with group settings ``shared``: a stashed one that
    fits, else a newly asked one; one that needs other group settings is stashed for the next group
    (at most a group's worth) and the slot waits for the next iteration."""
    for i, (trial, params) in enumerate(stash):
        if split_params(space, params)[1] == shared:
            return stash.pop(i)
    if len(stash) >= space.trials_per_group:
        return None
    got = _ask(study, space, me)
    if got is None or split_params(space, got[1])[1] == shared:
        return got
    stash.append(got)
    return None


def _clocks() -> tuple[float, float]:
    """(wall, this process's CPU) seconds: a trial's cost is its share of its group's."""
    return time.perf_counter(), time.process_time()


def train_group(space: Space, study, group: list[tuple[Any, dict[str, Any]]], run_root: Path, tracking_uri: str,
                parent: str | None, fit_extra: dict[str, Any] | None = None, next_trial=None) -> dict[int, str]:
    """Train one group of trials and tell each its result; returns ``{trial number: state}``.

    Each trial holds ``seeds.count`` consecutive slots of the group and is judged on its own frames:
    at each pruning milestone it reports its objective (told PRUNED where the pruner says so); at
    ``frames`` it is told its objective. Its slots are then free: with ``next_trial`` (called with the
    group's settings; returns ``(trial, values)`` or None) and a `refillable` group, they take the next
    trial, which starts afresh there (the module's ``refill_member``: a refilled member is its trial's
    single run, `tests/test_member_settings.py`); else they idle. The group stops
    when no slot holds a trial."""

    per_trial = len(space.seeds)
    members = [(params, s) for _, params in group for s in space.seeds]
    name = f"trials-{'-'.join(str(t.number) for t, _ in group)}"
    run_dir = run_root / "groups" / name
    refill = next_trial is not None and refillable(space, len(members))
    shared = split_params(space, group[0][1])[1]
    milestones = space.pruner.milestones if space.pruner.name != "none" else ()
    states: dict[int, str] = {}
    # the trials in the group's slots: trial number -> [trial, values, first slot, next milestone, start clocks]
    active: dict[int, list] = {t.number: [t, p, i * per_trial, 0, _clocks()] for i, (t, p) in enumerate(group)}

    def tell(trial, **kw) -> bool:
        try:
            study.tell(trial, **kw)
            return True
        except UpdateFinishedTrialError:  # failed by a worker that took this one for gone
            print(f"[tune] trial {trial.number} was failed by another worker meanwhile; not told", flush=True)
            return False

    def curves_of(slot: int, upto: float | None = None):
        cs = reporter.curves[slot:slot + per_trial]
        return cs if upto is None else [[p for p in c if p[0] <= upto] for c in cs]

    def charge(trial, started: tuple[float, float], own: float) -> None:
        """The trial's share of the group's wall and CPU time while it held its slots, and its member-frames."""
        wall, cpu = (now - then for now, then in zip(_clocks(), started))
        share = per_trial / len(members)
        trial.set_user_attr("train_s", wall * share)
        trial.set_user_attr("cpu_s", cpu * share)
        trial.set_user_attr("member_frames", own * per_trial)

    def finish(number: int, own: float) -> None:
        trial, params, slot, _, started = active.pop(number)
        value, per_seed = objective(space, curves_of(slot), own)
        trial.set_user_attr("seed_values", per_seed)
        charge(trial, started, own)
        if math.isfinite(value) and tell(trial, values=value):
            states[trial.number] = "COMPLETE"
        else:
            trial.set_user_attr("error", "no finished episode in a seed (objective undefined)")
            tell(trial, state=TrialState.FAIL)
            states[trial.number] = "FAIL"
        record_trial(space, tracking_uri, parent, trial, params, states[trial.number], value, per_seed, curves_of(slot), name)

    def on_iteration(frames: float) -> bool:
        freed = []
        for number in list(active):
            trial, params, slot, ms, _ = active[number]
            own = frames - reporter.starts[slot]
            while number in active and ms < len(milestones) and own >= milestones[ms]:
                m = milestones[ms]
                ms = active[number][3] = ms + 1
                value, _ = objective(space, curves_of(slot), m)
                if not math.isfinite(value):
                    continue
                trial.report(value, step=m)
                if not trial.should_prune():
                    continue
                charge(trial, active[number][4], own)
                if tell(trial, state=TrialState.PRUNED):
                    states[number] = "PRUNED"
                    active.pop(number)
                    freed.append((slot, number))
                    print(f"[tune] trial {number} pruned at {m} frames ({space.metric} {value:.4f})", flush=True)
                    record_trial(space, tracking_uri, parent, trial, params, "PRUNED", None, [], curves_of(slot, m), name)
            if number in active and own >= space.frames:
                finish(number, own)
                freed.append((slot, number))
        for slot, before in sorted(freed) if refill else ():
            got = next_trial(shared)
            if got is None:
                continue
            trial, params = got
            trial.set_user_attr("group", name)
            trial.set_user_attr("refilled_slot", slot)
            trial.set_user_attr("refill_of", before)
            values = scaled(space, member_values(space, params))
            for j, seed in enumerate(space.seeds):
                reporter.refill(slot + j, seed, values)
            active[trial.number] = [trial, params, slot, 0, _clocks()]
            print(f"[tune] trial {trial.number} refills the slots of a finished or pruned trial at {frames:.0f} frames "
                  f"of {name}", flush=True)
        return not active

    # with refills the group trains until its last trial ends (the trials' budgets are their own frames),
    # and an lr schedule is each member's own over its trial's frames, counted from its start
    schedule = str(space.setting("model.lr_schedule", shared) or "constant")
    own_schedule = (schedule, space.frames) if refill and schedule != "constant" else None
    from ppo_lightning.tuning.reporter import TrialReporter  # start-up cost: Lightning only where a group trains

    reporter = TrialReporter(len(members), on_iteration, own_schedule)
    budget = space.frames * max(1, space.trials) if refill else space.frames
    spec = group_spec(space, members, refill).with_settings({
        **({"model.lr_schedule": "constant"} if own_schedule else {}), "trainer.enable_progress_bar": False,
        "trainer.enable_checkpointing": False, "video_every": None, "mlflow.enabled": False, "run_dir": str(run_dir),
        "data.total_frames": budget, **(fit_extra or {})})
    for trial, _ in group:
        trial.set_user_attr("group", name)
    try:
        run = train(spec, callbacks=[reporter])
    except BaseException as err:
        for trial, _, _, _, _ in list(active.values()):
            trial.set_user_attr("error", str(err).strip().splitlines()[-1] if str(err).strip() else repr(err))
            tell(trial, state=TrialState.FAIL)
        raise
    if run.exit_code:  # stopped by a signal: its trials are asked again by the next worker
        for trial, _, _, _, _ in list(active.values()):
            if tell(trial, state=TrialState.FAIL):
                study.enqueue_trial(dict(trial.params), user_attrs={"retry_of": trial.number})
        raise SystemExit(run.exit_code)
    frames = run.frames
    if frames < space.frames and not any(s == "COMPLETE" for s in states.values()):
        print(f"[tune] {name}: every trial pruned; the group stopped at {frames:.0f} of {space.frames} frames", flush=True)
    for number, (_, _, slot, _, _) in list(active.items()):  # the group's frames ran out (a single run at its budget)
        finish(number, frames - reporter.starts[slot])
    return states


def run_worker(space: Space, run_root: Path, storage: Path | None = None, tracking_uri: str | None = None,
               stale_after: float = STALE_AFTER_S, heartbeat_s: float = HEARTBEAT_S, worker_id: str | None = None,
               fit_extra: dict[str, Any] | None = None) -> int:
    """Ask, train and tell until the search has its trials; returns how many trials this worker told."""
    run_root = Path(run_root).resolve()
    run_root.mkdir(parents=True, exist_ok=True)
    storage = journal(Path(storage) if storage else journal_path(run_root))
    tracking_uri = tracking_uri or f"sqlite:///{run_root / 'mlflow.db'}"
    stash: list = []
    with Lease(run_root, worker_id, heartbeat_s) as lease:
        probe = open_study(space, storage)
        study = open_study(space, storage, seed_offset=len(probe.trials))  # concurrent workers sample differently
        parent = parent_run(space, run_root, tracking_uri)
        try:
            told = _work(space, study, storage, run_root, tracking_uri, parent, lease, stash, stale_after, fit_extra)
        except BaseException:  # a signal, an error, Ctrl-C: the trials asked here and not told go back to the study
            hand_back(study, storage, lease.id)
            raise
    return told


def _work(space: Space, study, storage: JournalStorage, run_root: Path, tracking_uri: str, parent: str | None,
          lease: Lease, stash: list, stale_after: float, fit_extra: dict[str, Any] | None) -> int:
    """The worker's loop (`run_worker`): ask a group's worth of trials, train them, until none is left."""
    told = 0
    while True:
        requeue_stale(study, storage, run_root, stale_after, me=lease.id)
        asked, stash[:] = list(stash), []  # trials asked for a refill that another group's settings needed
        while len(asked) < space.trials_per_group:
            got = _ask(study, space, lease.id)
            if got is None:
                break
            asked.append(got)
        if not asked:
            break
        groups = plan_groups(space, asked)
        if len(groups) > 1:
            split = sorted({k for _, p in asked for k in split_params(space, p)[1]})
            print(f"[tune] {len(asked)} trials train as {len(groups)} groups ({', '.join(str(len(g)) for g in groups)} "
                  f"trials): {', '.join(split)} cannot differ within a group", flush=True)
        for group in groups:
            print(f"[tune] trials {[t.number for t, _ in group]}: one group of {len(group) * len(space.seeds)} members",
                  flush=True)
            states = train_group(space, study, group, run_root, tracking_uri, parent, fit_extra,
                                 next_trial=lambda shared: _next_for(study, space, lease.id, shared, stash))
            told += len(states)
    return told
