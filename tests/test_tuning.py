"""Issue 40: a search space is a file (validated before anything runs); Optuna's trials train as
members of one vectorized group, each member its trial's single run; workers share a study through
the journal file; a killed worker's trials are asked again and finished ones stay; pruning at frame
milestones stops a group whose trials are all pruned."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ppo_lightning.tuning.space import SpaceError, load_space

ROOT = Path(__file__).resolve().parents[1]
BASE = str(ROOT / "experiments" / "minatar" / "ppo.yaml")
TINY_FIT = {"model.decoupled": True, "data.num_envs": 4, "data.rollout_steps": 16, "data.num_minibatches": 2,
            "data.update_epochs": 1, "trainer.precision": "32-true"}


def tiny(tmp_path: Path, **over) -> Path:
    d = {"tuning": "tiny", "base": BASE, "fit": TINY_FIT, "env": "minatar:breakout", "frames": 256, "trials": 2,
         "members": 2, "seeds": {"count": 1, "first": 0}, "objective": {"metric": "auc", "score": "minatar"},
         "sampler": {"name": "random", "seed": 0},
         "params": {"model.lr": {"type": "float", "low": 0.0005, "high": 0.016, "log": True},
                    "model.proximal_com": {"type": "categorical", "choices": [None, 4, 8]}}}
    d.update(over)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(d))
    return path


# ----------------------------------------------------------------------------------- space files
@pytest.mark.parametrize("change, field", [
    ({"frames": "100k"}, "frames"),
    ({"trials": 0}, "trials"),
    ({"members": 3, "seeds": {"count": 2}}, "members"),
    ({"seeds": {"count": 2, "frist": 1}}, "seeds.frist"),
    ({"base": "experiments/minatar/nope.yaml"}, "base"),
    ({"objective": {"metric": "iqm"}}, "objective.metric"),
    ({"objective": {"score": "minatar"}, "env": "CartPole-v1"}, "objective.score"),
    ({"sampler": {"name": "cmaes"}}, "sampler.name"),
    ({"pruner": {"name": "median", "milestones": [256]}}, "pruner.milestones"),
    ({"params": {"model.lr": {"type": "float", "low": 0.01, "high": 0.001}}}, "params.model.lr"),
    ({"params": {"model.lr": {"type": "float", "low": 0.0, "high": 0.01, "log": True}}}, "params.model.lr.log"),
    ({"params": {"model.lr": {"type": "normal", "low": 0.0, "high": 0.01}}}, "params.model.lr.type"),
    ({"params": {"model.lr": {"type": "float", "low": 1e-4, "high": 0.01, "lgo": True}}}, "params.model.lr.lgo"),
    ({"params": {"model.proximal_com": {"type": "categorical", "choices": [-1, 8]}}}, "params.model.proximal_com.choices"),
    ({"params": {"data.seed": {"type": "int", "low": 0, "high": 9}}}, "params.data.seed"),
    ({"params": {"lr": {"type": "float", "low": 1e-4, "high": 0.01}}}, "params.lr"),
    ({"params": {"data.num_envs": {"type": "int", "low": 2, "high": 8}}, "fit": {"data.num_envs": 4}}, "params.data.num_envs"),
    ({"fit": {**TINY_FIT, "model.decoupled": False}}, "params.model.proximal_com"),
    ({"colour": "blue"}, "colour"),
    ({"refill": "no"}, "refill"),
])
def test_a_bad_field_is_one_line_naming_it(tmp_path, change, field):
    with pytest.raises(SpaceError) as err:
        load_space(tiny(tmp_path, **change))
    msg = str(err.value)
    assert "\n" not in msg and f": {field}" in msg, msg


@pytest.mark.parametrize("key, value, accepted", [
    ("video_every", None, True), ("log_every_frames", 1024, True), ("checkpoint_every", 5, True),
    ("trainer.callbacks+", "ppo_lightning.training.noise_scale.GradientNoiseScale", True),
    ("mlflow.experiment", "x", True), ("scale", 4, True), ("trainer.gradient_clip_val", 0.5, True),
    ("seed_everything", 3, False), ("data.seed", 3, False), ("run_dir", "x", False), ("lr", 0.1, False),
    ("model", {"lr": 0.1}, False), ("nope", 1, False),
])
def test_study_and_space_files_share_one_fit_vocabulary(tmp_path, key, value, accepted):
    """A fit option a study file takes, a search-space file takes, and the reverse (one validator,
    `ppo_lightning.studies.fields`): the same key is accepted or refused, in one line naming it, by both."""
    from ppo_lightning.studies.spec import StudyError, load_study

    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump({"study": "s", "base": BASE, "fit": {key: value}, "envs": ["minatar:breakout"],
                                     "seeds": {"count": 1}, "frames": 256, "arms": [{"name": "a", "label": "A"}]}))
    space = tiny(tmp_path, fit={**TINY_FIT, key: value})
    for load, error in ((lambda: load_study(study), StudyError), (lambda: load_space(space), SpaceError)):
        if accepted:
            assert load().fit[key] == value
        else:
            with pytest.raises(error) as err:
                load()
            assert "\n" not in str(err.value) and f"fit.{key}: " in str(err.value), str(err.value)


def test_a_search_states_what_it_sets_for_every_trial_or_is_refused(tmp_path):
    """The settings a search gives every trial's group (no videos, no MLflow run of the group's own, no
    checkpoints): the same value in the file is accepted, another is one line saying why."""
    assert load_space(tiny(tmp_path, fit={**TINY_FIT, "video_every": None, "mlflow.enabled": False})).fit["video_every"] is None
    with pytest.raises(SpaceError, match=r"fit.video_every: a search records no videos, so the search sets it to null "
                                         r"for every run \(got 4\)"):
        load_space(tiny(tmp_path, fit={**TINY_FIT, "video_every": 4}))
    with pytest.raises(SpaceError, match=r"fit.mlflow.enabled: .* sets it to false for every run \(got true\)"):
        load_space(tiny(tmp_path, fit={**TINY_FIT, "mlflow.enabled": True}))


def test_the_shipped_search_spaces_are_valid_and_the_command_overrides_the_file(tmp_path):
    files = sorted((ROOT / "experiments" / "tuning").glob("*.yaml"))
    assert files
    for f in files:
        space = load_space(f)
        assert space.trials_per_group * len(space.seeds) == space.members
    space = load_space(tiny(tmp_path), {"trials": 7, "members": 4, "frames": 512})
    assert (space.trials, space.members, space.frames, space.trials_per_group) == (7, 4, 512, 4)
    with pytest.raises(SpaceError, match="members: 3 members do not hold whole trials"):
        load_space(tiny(tmp_path, seeds={"count": 2}), {"members": 3})


def test_member_settings_ride_in_one_group_and_other_settings_split_it(tmp_path):
    from ppo_lightning.tuning import runner

    fit = {k: v for k, v in TINY_FIT.items() if k != "data.num_minibatches"}
    space = load_space(tiny(tmp_path, fit={**fit, "scale": 2}, params={
        "model.lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True},
        "model.proximal_com": {"type": "categorical", "choices": [None, 4]},
        "data.num_minibatches": {"type": "categorical", "choices": [1, 2]}}))
    asked = [("t0", {"model.lr": 1e-3, "model.proximal_com": None, "data.num_minibatches": 2}),
             ("t1", {"model.lr": 4e-3, "model.proximal_com": 4, "data.num_minibatches": 1}),
             ("t2", {"model.lr": 2e-3, "model.proximal_com": 4, "data.num_minibatches": 2})]
    groups = runner.plan_groups(space, asked)
    assert [[t for t, _ in g] for g in groups] == [["t0", "t2"], ["t1"]]
    spec = runner.group_spec(space, [(p, 0) for _, p in groups[0]])
    hp = spec.members.settings
    # --scale 2's rules applied here, as a single run applies them to its own values: lr / sqrt(2), com x 2
    assert hp["lr"] == pytest.approx([1e-3 / 2 ** 0.5, 2e-3 / 2 ** 0.5]) and hp["proximal_com"] == [None, 8.0]
    assert spec.options["scale_rules"] == "none" and spec.data["num_minibatches"] == 2
    single = runner.group_spec(space, [(groups[1][0][1], 3)])
    assert single.members is None and single.model["lr"] == 0.004 and single.seed == 3


@pytest.mark.timeout(300)
def test_a_tuned_member_is_the_single_run_of_its_trial(tmp_path, monkeypatch):
    from ppo_lightning.run import train
    from ppo_lightning.tuning import runner
    from ppo_lightning.tuning.reporter import TrialReporter

    monkeypatch.chdir(tmp_path)
    space = load_space(tiny(tmp_path))
    trials = [{"model.lr": 0.002, "model.proximal_com": None}, {"model.lr": 0.008, "model.proximal_com": 4}]
    off = {"trainer.enable_checkpointing": False, "video_every": None, "mlflow.enabled": False,
           "trainer.enable_progress_bar": False}
    group = TrialReporter(2)
    train(runner.group_spec(space, [(p, 0) for p in trials]).with_settings({**off, "run_dir": str(tmp_path / "g")}),
          callbacks=[group])
    alone = TrialReporter(1)
    train(runner.single_spec(space, trials[1], 0).with_settings({**off, "run_dir": str(tmp_path / "s")}), callbacks=[alone])
    assert repr(group.curves[1]) == repr(alone.curves[0]) and len(alone.curves[0]) == 4
    assert repr(group.curves[0]) != repr(group.curves[1])  # the other trial's settings learned otherwise


# ----------------------------------------------------------------------------------- workers
def _study(space, root):
    from ppo_lightning.tuning import runner

    return runner.open_study(space, runner.journal_path(root))


def _space_with_a_best_trial(tmp_path, trials, **over):
    """A median-pruned space (milestones 128, 256 of 512 frames) whose study already holds one finished
    trial far ahead of anything 64 frames can reach: the trials a worker trains next are pruned."""
    space = load_space(tiny(tmp_path, trials=trials, frames=512,
                            pruner={"name": "median", "milestones": [128, 256], "n_startup_trials": 1}), over)
    root = tmp_path / "runs"
    study = _study(space, root)
    best = study.ask()
    for p in space.params.values():
        p.suggest(best)
    best.report(100.0, step=128)
    study.tell(best, 100.0)
    return space, root


@pytest.mark.timeout(300)
def test_a_killed_worker_loses_no_finished_trial_and_its_running_one_is_asked_again(tmp_path, monkeypatch):
    """A journal as a killed worker leaves it: one trial told, one RUNNING under a worker whose process
    is gone. The next worker fails the orphan, asks its settings again and completes the search."""
    from optuna.trial import TrialState

    from ppo_lightning.tuning import runner

    monkeypatch.chdir(tmp_path)
    space = load_space(tiny(tmp_path, trials=3))
    root = tmp_path / "runs"
    study = _study(space, root)
    done = study.ask()
    done_params = {n: p.suggest(done) for n, p in space.params.items()}
    study.tell(done, 0.25)
    orphan = study.ask()
    orphan_params = {n: p.suggest(orphan) for n, p in space.params.items()}
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    import socket

    (root / "workers").mkdir(parents=True)
    (root / "workers" / "gone.json").write_text(json.dumps({"host": socket.gethostname(), "pid": int(dead.stdout), "time": 0}))
    orphan.set_user_attr("worker", "gone")
    assert runner.run_worker(space, root, stale_after=3600) == 2
    trials = _study(space, root).get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.FAIL, TrialState.COMPLETE, TrialState.COMPLETE]
    assert trials[0].value == 0.25 and trials[0].params == done_params
    assert trials[2].user_attrs["retry_of"] == 1 and trials[2].params == trials[1].params
    assert {k: trials[2].params[k] for k in orphan_params} == orphan_params
    assert trials[2].user_attrs["group"] == trials[3].user_attrs["group"]  # the retry and a new trial: one group
    # every trial is an MLflow run under the search's parent run
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("tiny").experiment_id])
    parent = [r for r in runs if r.data.tags.get("tuning_parent") == "true"]
    children = {r.data.tags["trial"] for r in runs if r.data.tags.get("mlflow.parentRunId") == parent[0].info.run_id}
    assert len(parent) == 1 and children == {"2", "3"}


@pytest.mark.timeout(300)
def test_pruned_trials_are_told_at_a_milestone_and_a_group_of_pruned_trials_stops(tmp_path, monkeypatch, capsys):
    from optuna.trial import TrialState

    from ppo_lightning.tuning import runner

    monkeypatch.chdir(tmp_path)
    space, root = _space_with_a_best_trial(tmp_path, trials=3)
    runner.run_worker(space, root)
    trials = _study(space, root).get_trials()
    assert [t.state for t in trials[1:]] == [TrialState.PRUNED, TrialState.PRUNED]
    assert all(list(t.intermediate_values) == [128] for t in trials[1:])
    assert "every trial pruned; the group stopped at 128 of 512 frames" in capsys.readouterr().out


@pytest.mark.timeout(600)
def test_concurrent_workers_share_one_study_and_the_command_summarizes_it(tmp_path, monkeypatch, capsys):
    """``tune --workers 2 --executor local``: two submitit jobs (local processes, at the same time, as two
    machines on a shared filesystem would) work on one study through its journal: the search gets
    exactly its trials, from both workers, and the command ends with its best settings."""
    import pickle

    from optuna.trial import TrialState

    from ppo_lightning.tuning.command import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))  # the jobs unpickle the worker
    space = tiny(tmp_path, trials=4, members=1)
    root = tmp_path / "runs"
    assert main(["--space", str(space), "--run-root", str(root), "--frames", "512", "--workers", "2", "--executor", "local"]) == 0
    trials = _study(load_space(space, {"frames": 512}), root).get_trials()
    real = [t for t in trials if not t.user_attrs.get("surplus")]
    assert [t.state for t in real] == [TrialState.COMPLETE] * 4
    jobs = [pickle.loads(f.read_bytes()) for f in sorted((root / "submitit").glob("*_0_result.pkl"))]
    assert len(jobs) == 2 and all(state == "success" for state, _ in jobs) and sum(told for _, told in jobs) == 4
    assert len({t.user_attrs["worker"] for t in real}) == 2  # both jobs told trials: they ran side by side
    out = capsys.readouterr().out
    assert "[tune] best: trial" in out and "train it on 8 fresh seeds: ppo-lightning fit" in out
    best = json.loads((root / "best.json").read_text())
    assert best["objective"] == max(t.value for t in real) and (root / "history.png").exists()
    # the search's cost: each trial's share of its group's CPU time and member-frames, summed
    assert best["cost"]["trials"] == 4 and best["cost"]["member_frames"] == 4 * 512 and best["cost"]["unrecorded"] == 0
    assert best["cost"]["cpu_s"] == pytest.approx(sum(t.user_attrs["cpu_s"] for t in real)) and best["cost"]["cpu_s"] > 0
    assert "[tune] cost: " in out and "M member-frames" in out

def test_loss_and_return_settings_ride_in_one_group(tmp_path):
    """A space searching the usual PPO settings (lr, clip range, entropy coefficient, gamma, GAE
    lambda, value coefficient) packs its trials into one group whose members carry them all."""
    from ppo_lightning.tuning import runner

    space = load_space(tiny(tmp_path, params={
        "model.lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True},
        "model.clip_eps": {"type": "float", "low": 0.1, "high": 0.3},
        "model.entropy_coef": {"type": "float", "low": 0.0, "high": 0.05},
        "model.value_coef": {"type": "categorical", "choices": [0.5, 1.0]},
        "data.gamma": {"type": "float", "low": 0.9, "high": 0.999},
        "data.gae_lambda": {"type": "float", "low": 0.8, "high": 1.0}}))
    asked = [(f"t{i}", {"model.lr": 1e-3 * (i + 1), "model.clip_eps": 0.1 + 0.1 * i, "model.entropy_coef": 0.01 * i,
                        "model.value_coef": [0.5, 1.0][i % 2], "data.gamma": 0.9 + 0.05 * i, "data.gae_lambda": 0.8 + 0.1 * i})
             for i in range(3)]
    (group,) = runner.plan_groups(space, asked)
    spec = runner.group_spec(space, [(p, 0) for _, p in group])
    hp = spec.members.settings
    assert hp["clip_eps"] == pytest.approx([0.1, 0.2, 0.3]) and hp["gamma"] == pytest.approx([0.9, 0.95, 1.0])
    assert hp["value_coef"] == [0.5, 1.0, 0.5] and hp["gae_lambda"] == pytest.approx([0.8, 0.9, 1.0])
    assert "clip_eps" not in spec.model and "gamma" not in spec.data
    with pytest.raises(SpaceError, match=r"params.data.gamma.high: 1.5 is not a valid gamma"):
        load_space(tiny(tmp_path, params={"data.gamma": {"type": "float", "low": 0.9, "high": 1.5}}))


@pytest.mark.timeout(300)
def test_a_pruned_trials_slot_is_refilled_with_the_next_trial(tmp_path, monkeypatch, capsys):
    """Trials 1 and 2 train as one group and are pruned at 128 frames; the next asked trial (3) takes a
    freed slot in the same process and is judged on its own frames (its milestone at its own 128,
    the group's 256); with no trial left the group stops."""
    from optuna.trial import TrialState

    from ppo_lightning.tuning import runner

    monkeypatch.chdir(tmp_path)
    space, root = _space_with_a_best_trial(tmp_path, trials=4)
    runner.run_worker(space, root)
    trials = _study(space, root).get_trials()
    assert [t.state for t in trials[1:]] == [TrialState.PRUNED] * 3
    assert all(list(t.intermediate_values) == [128] for t in trials[1:])
    assert trials[3].user_attrs["group"] == trials[1].user_attrs["group"] == "trials-1-2"
    assert trials[3].user_attrs["refilled_slot"] == 0
    out = capsys.readouterr().out
    assert "trial 3 refills the slots of a finished or pruned trial at 128 frames" in out
    assert "every trial pruned; the group stopped at 256 of 512 frames" in out
    # a pruned trial is charged its own frames and its slot's share of the group's CPU time up to its pruning
    assert [t.user_attrs["member_frames"] for t in trials[1:]] == [128, 128, 128]
    assert all(t.user_attrs["cpu_s"] > 0 for t in trials[1:])
    # trial 3 has its own MLflow run under the search's, with its settings and its curve over its own frames
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    runs = {r.data.tags["trial"]: r for r in client.search_runs([client.get_experiment_by_name("tiny").experiment_id])
            if "mlflow.parentRunId" in r.data.tags}
    assert sorted(runs) == ["1", "2", "3"] and len({r.info.run_id for r in runs.values()}) == 3
    assert (runs["3"].data.tags["slot"], runs["3"].data.tags["refill_of"]) == ("0", "1")
    assert "refill_of" not in runs["1"].data.tags and trials[3].user_attrs["refill_of"] == 1
    for t in trials[1:]:
        assert runs[str(t.number)].data.params["model.lr"] == str(t.params["model.lr"])
        curve = client.get_metric_history(runs[str(t.number)].info.run_id, "seed0/episode/return_mean20")
        assert [m.step for m in curve] == [64, 128]  # each trial's own frames, up to its milestone



KILL_AFTER_REFILL = """
import os, signal, sys
from ppo_lightning.tuning import runner
from ppo_lightning.tuning.space import load_space

from ppo_lightning.tuning.reporter import TrialReporter

end = TrialReporter.on_train_epoch_end

def killed_after_refill(self, trainer, pl_module):  # SIGKILL once a refilled trial has trained an iteration
    end(self, trainer, pl_module)
    if any(start > 0 and curve for start, curve in zip(self.starts, self.curves)):
        os.kill(os.getpid(), signal.SIGKILL)

TrialReporter.on_train_epoch_end = killed_after_refill
runner.run_worker(load_space(sys.argv[1]), sys.argv[2])
"""


@pytest.mark.timeout(300)
def test_a_job_killed_after_a_refill_resumes_losing_no_told_trial_and_re_asking_the_refilled_ones(tmp_path, monkeypatch):
    """A worker's trials 1 and 2 are pruned at 128 frames and trials 3 and 4 refill their slots; the
    worker is SIGKILLed one iteration later, trials 3 and 4 RUNNING. The resumed job keeps every told
    trial as it was (states, values, reports, MLflow runs), fails 3 and 4 and asks their settings again
    (5 and 6, trained afresh as a group of their own), and the journal ends with the search's 5 trials."""
    from mlflow.tracking import MlflowClient
    from optuna.trial import TrialState

    from ppo_lightning.tuning import runner

    monkeypatch.chdir(tmp_path)
    space, root = _space_with_a_best_trial(tmp_path, trials=5)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    job = subprocess.run([sys.executable, "-c", KILL_AFTER_REFILL, str(space.path), str(root)], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=240)
    assert job.returncode == -9, job.stderr[-2000:]
    assert "trial 3 refills the slots" in job.stdout and "trial 4 refills the slots" in job.stdout
    before = _study(space, root).get_trials()
    assert [t.state for t in before] == [TrialState.COMPLETE] + [TrialState.PRUNED] * 2 + [TrialState.RUNNING] * 2
    assert [t.user_attrs["refilled_slot"] for t in before[3:]] == [0, 1]
    assert all(t.user_attrs["group"] == "trials-1-2" for t in before[1:])

    runner.run_worker(space, root)
    after = _study(space, root).get_trials()
    assert [t.state for t in after] == ([TrialState.COMPLETE] + [TrialState.PRUNED] * 2 + [TrialState.FAIL] * 2
                                        + [TrialState.PRUNED] * 2)
    for old, new in zip(before[:3], after[:3]):  # told trials: untouched
        assert (new.params, new.value, new.intermediate_values) == (old.params, old.value, old.intermediate_values)
    for dead, retry in ((after[3], after[5]), (after[4], after[6])):  # the refilled trials, asked again afresh
        assert retry.user_attrs["retry_of"] == dead.number and retry.params == dead.params
        assert dead.user_attrs["failed_because"].startswith("worker ") and list(retry.intermediate_values) == [128]
        assert retry.user_attrs["group"] == "trials-5-6" and "refilled_slot" not in retry.user_attrs
    assert len(runner.counted(_study(space, root))) == space.trials
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("tiny").experiment_id])
    assert sorted(r.data.tags["trial"] for r in runs if "mlflow.parentRunId" in r.data.tags) == ["1", "2", "5", "6"]


@pytest.mark.timeout(300)
def test_a_worker_stopped_between_groups_hands_back_the_trial_it_asked_for_the_next(tmp_path, monkeypatch):
    """Trials 0 and 1 (2 minibatches) finish as a group; the refill asks trial 2, which needs 1
    minibatch and waits for the next group; the worker is interrupted there. Trial 2 goes back to the
    study at once (failed, its settings enqueued), so the resumed job trains it (trial 3) instead of
    counting it as running until its worker's lease is stale."""
    from optuna.trial import TrialState

    from ppo_lightning.tuning import runner

    monkeypatch.chdir(tmp_path)
    fit = {k: v for k, v in TINY_FIT.items() if k != "data.num_minibatches"}
    space = load_space(tiny(tmp_path, trials=3, fit=fit, params={
        "model.lr": {"type": "float", "low": 0.0005, "high": 0.016, "log": True},
        "data.num_minibatches": {"type": "categorical", "choices": [1, 2]}}))
    root = tmp_path / "runs"
    study = _study(space, root)
    for lr, mb in ((0.002, 2), (0.004, 2), (0.008, 1)):
        study.enqueue_trial({"model.lr": lr, "data.num_minibatches": mb})
    real = runner.train_group

    def interrupted(*args, **kwargs):
        real(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "train_group", interrupted)
    with pytest.raises(KeyboardInterrupt):
        runner.run_worker(space, root, stale_after=3600)
    monkeypatch.setattr(runner, "train_group", real)
    trials = _study(space, root).get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2 + [TrialState.FAIL, TrialState.WAITING]
    assert "stopped before training it" in trials[2].user_attrs["failed_because"]
    runner.run_worker(space, root, stale_after=3600)
    trials = _study(space, root).get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2 + [TrialState.FAIL, TrialState.COMPLETE]
    assert trials[3].params == trials[2].params and trials[3].user_attrs["retry_of"] == 2


def test_refill_is_on_by_default_off_with_the_switch_and_on_for_ppg(tmp_path):
    from ppo_lightning.tuning import runner

    on, off = load_space(tiny(tmp_path)), load_space(tiny(tmp_path), {"refill": False})
    assert on.refill and runner.refillable(on, 2) and not runner.refillable(on, 1)
    assert not off.refill and not runner.refillable(off, 2)
    ppg = load_space(tiny(tmp_path, base="minatar/ppg", params={"model.lr": {"type": "float", "low": 1e-4, "high": 0.01}}))
    assert ppg.refill and runner.refillable(ppg, 2)  # a PPG group refills where its next phase starts


@pytest.mark.timeout(300)
def test_with_refill_off_a_pruned_trials_slots_idle_and_the_next_trial_trains_in_a_new_group(tmp_path, monkeypatch, capsys):
    from optuna.trial import TrialState

    from ppo_lightning.tuning.command import main

    monkeypatch.chdir(tmp_path)
    space, root = _space_with_a_best_trial(tmp_path, trials=4, refill=False)
    assert main(["--space", str(space.path), "--run-root", str(root), "--frames", "512", "--no-refill", "--no-plots"]) == 0
    trials = _study(space, root).get_trials()
    assert [t.state for t in trials[1:]] == [TrialState.PRUNED] * 3
    assert [t.user_attrs["group"] for t in trials[1:]] == ["trials-1-2", "trials-1-2", "trials-3"]
    assert not any("refilled_slot" in t.user_attrs for t in trials)
    out = capsys.readouterr().out
    assert "refills" not in out and "every trial pruned; the group stopped at 128 of 512 frames" in out


def test_a_refilled_member_on_an_lr_schedule_anneals_from_its_own_start_as_its_single_run():
    """Trials of 4 iterations on a linear lr schedule, packed as a group (at a constant lr; the tuner's
    reporter sets each member's lr): member 1's slot is refilled before the group's iteration 3 (another
    seed, lr and gamma) and the group trains 7. Member 1 ends as the fresh single run of its trial with
    ``model.lr_schedule: linear`` over its 4 iterations (its lr at its last 1e-3 x 1/4, not the group's),
    member 0 as its own single run over 4 (its lr 0 once its trial's frames are spent)."""
    import lightning.pytorch as pl
    import torch

    from ppo_lightning.data.datamodule import RolloutDataModule
    from ppo_lightning.training.module import PPOLightningModule
    from ppo_lightning.tuning.reporter import TrialReporter
    from tests.test_group_members import DATA, NET, KeepSource, fit

    first, new = {"lr": [3e-3, 2e-3], "gamma": [0.99, 0.9]}, {"lr": 1e-3, "gamma": 0.95}
    pl.seed_everything(0)
    gdm = RolloutDataModule(**DATA, total_frames=32 * 7, seed=0, member_seeds=[0, 1], member_hparams=first)
    model = PPOLightningModule(gdm.observation_space, gdm.action_space, network=NET, seeds=gdm.seeds, member_hparams=first)
    reporter = TrialReporter(2, lambda frames: frames == 96 and reporter.refill(1, 5, new), lr_schedule=("linear", 32 * 4))
    trainer = pl.Trainer(max_epochs=-1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, callbacks=[KeepSource(), reporter])
    trainer.fit(model, datamodule=gdm)
    assert [lr for lr, _ in trainer.optimizers[0].settings] == [0.0, 1e-3 * 0.25] and reporter.starts == [0.0, 96.0]
    for k, seed, lr, gamma in ((1, 5, 1e-3, 0.95), (0, 0, 3e-3, 0.99)):
        pl.seed_everything(seed)
        dm = RolloutDataModule(**DATA, total_frames=32 * 4, seed=seed, gamma=gamma)
        alone, dm, _ = fit(dm, lr=lr, lr_schedule="linear")
        for name, ref in alone.network.state_dict().items():
            torch.testing.assert_close(model.network.seed_state_dict(k)[name], ref, rtol=1e-5, atol=3e-5,
                                       msg=f"member {k} {name}")
    assert dm.states[0].episodes.state_dict() != gdm.kept.states[0].episodes.state_dict()  # member 0 went on collecting at lr 0


def test_a_ppg_groups_refill_waits_for_the_next_phase_and_the_slot_idles_meanwhile(tmp_path):
    """PPG (an auxiliary phase every 2 iterations) in a group of 2: a refill queued after iteration 1
    (mid-phase) is applied before iteration 3, where the next phase starts; in between the slot's
    curve gets no point and its start moves with the group, so the new trial's frames count from the
    refill. Its members' settings and the plan: one group for trials that differ in member settings."""
    import lightning.pytorch as pl

    from ppo_lightning.data.datamodule import RolloutDataModule
    from ppo_lightning.training.module import PPOLightningModule
    from ppo_lightning.tuning import runner
    from ppo_lightning.tuning.reporter import TrialReporter
    from tests.test_group_members import DATA, NET

    first, new = {"lr": [3e-3, 2e-3]}, {"lr": 1e-3}
    pl.seed_everything(0)
    gdm = RolloutDataModule(**DATA, total_frames=32 * 5, seed=0, member_seeds=[0, 1], member_hparams=first)
    model = PPOLightningModule(gdm.observation_space, gdm.action_space, seeds=gdm.seeds, member_hparams=first,
                               network={**NET, "arch": "dual", "aux_value_head": True},
                               ppg={"n_pi": 2, "n_aux_epochs": 1, "aux_mbsize": 1})
    reporter = TrialReporter(2, lambda frames: frames == 32 and reporter.refill(1, 5, new))
    trainer = pl.Trainer(max_epochs=-1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, callbacks=[reporter])
    trainer.fit(model, datamodule=gdm)
    assert gdm.seeds == [0, 5] and reporter.starts == [0.0, 64.0] and not reporter.pending
    assert [f for f, _ in reporter.curves[0]] == [32.0, 64.0, 96.0, 128.0, 160.0]
    assert [f for f, _ in reporter.curves[1]] == [32.0, 64.0, 96.0]  # iterations 3-5 of the group, the trial's 1-3
    ppg = load_space(tiny(tmp_path, base="minatar/ppg", params={"model.lr": {"type": "float", "low": 1e-4, "high": 0.01}}))
    assert len(runner.plan_groups(ppg, [("a", {"model.lr": 1e-3}), ("b", {"model.lr": 3e-3})])) == 1


def test_a_ppg_search_refills_a_pruned_trials_slot_where_the_next_phase_starts(tmp_path, monkeypatch, capsys):
    """A PPG search (an auxiliary phase every 4 iterations of 64 frames): trials 1 and 2 are pruned at
    128 frames, mid-phase; trial 3 takes slot 0 where the next phase starts (the group's 256 frames) and
    is judged on its own frames: pruned at its own 128, the group's 384, where the group stops."""
    from optuna.trial import TrialState

    from ppo_lightning.tuning import runner

    monkeypatch.chdir(tmp_path)
    fit = {**TINY_FIT, "model.decoupled": False, "model.ppg.n_pi": 4, "model.ppg.n_aux_epochs": 1,
           "model.ppg.aux_mbsize": 2}
    space = load_space(tiny(tmp_path, base="minatar/ppg", fit=fit, trials=4, frames=512,
                            params={"model.lr": {"type": "float", "low": 0.0005, "high": 0.016, "log": True}},
                            pruner={"name": "median", "milestones": [128, 256], "n_startup_trials": 1}))
    root = tmp_path / "runs"
    study = _study(space, root)
    best = study.ask()
    for p in space.params.values():
        p.suggest(best)
    best.report(100.0, step=128)
    study.tell(best, 100.0)
    runner.run_worker(space, root)
    trials = _study(space, root).get_trials()
    assert [t.state for t in trials[1:]] == [TrialState.PRUNED] * 3
    assert [list(t.intermediate_values) for t in trials[1:]] == [[128]] * 3
    assert trials[3].user_attrs["refilled_slot"] == 0 and trials[3].user_attrs["group"] == "trials-1-2"
    out = capsys.readouterr().out
    assert "trial 3 refills the slots of a finished or pruned trial at 128 frames" in out
    assert "every trial pruned; the group stopped at 384 of 512 frames" in out

