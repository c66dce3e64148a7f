"""Issue 48: a downloaded checkpoint, exported folder or shared study / space file never runs code or
writes outside its place. Every case uses real files: a module that would create a marker file when
imported, a checkpoint that names another run folder, planted symbolic links, an alias bomb, a pickle
payload, study and search files whose arms would fail in a worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import lightning.pytorch  # noqa: F401  (imported at collection: its log handler binds the real stderr, not a test's capture)
import pytest
import torch
import yaml

from ppo_lightning.core.safety import (UnsafeInput, UntrustedCode, check_code, code_references, env_dirname,
                                       load_yaml, open_nofollow, safe_name)

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1",
       "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
FIT = ["fit", "--config", "cartpole/ppo", "--trainer.enable_progress_bar", "false", "--video_every", "null",
       "--data.num_envs", "4", "--data.rollout_steps", "16", "--data.num_minibatches", "2", "--data.update_epochs", "1",
       "--data.total_frames", "64"]
BOMB = "".join(f"{c}: &{c} [{', '.join([f'*{p}'] * 9) if p else ', '.join(['lol'] * 9)}]\n"
               for p, c in zip([None, *"abcdefgh"], "abcdefghi"))


def one_error_line(err: str) -> str:
    """The output's one ``error:`` line (and no traceback)."""
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert "Traceback" not in err, err[-3000:]
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert len(errors) == 1, err[-3000:]
    return errors[0]


def evil_module(folder: Path) -> tuple[str, Path]:
    """A module in ``folder`` that creates a marker file when imported (and registers Evil<name>-v0,
    a CartPole, and an objective ``obj``): (its name, the marker)."""
    name = f"evil_{uuid.uuid4().hex[:8]}"
    marker = folder / f"{name}.imported"
    (folder / f"{name}.py").write_text(
        "import pathlib\nimport gymnasium as gym\n"
        f"pathlib.Path({str(marker)!r}).touch()\n"
        f"gym.register('Evil{name}-v0', entry_point='gymnasium.envs.classic_control:CartPoleEnv', max_episode_steps=50)\n"
        "from ppo_lightning.algos.registry import clip as obj\n")
    return name, marker


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two tiny CartPole runs, A and B, tracked in one SQLite store."""
    from ppo_lightning.cli.fit import main

    tmp = tmp_path_factory.mktemp("runs")
    store = f"sqlite:///{tmp / 'mlflow.db'}"
    for name in ("A", "B"):
        assert main([*FIT, "--run_dir", str(tmp / name), "--mlflow.tracking_uri", store, "--mlflow.experiment", "u"]) == 0
    return tmp, store


def _mutate(src: Path, dst: Path, edit) -> Path:
    checkpoint = torch.load(src, weights_only=True)
    edit(checkpoint)
    torch.save(checkpoint, dst)
    return dst


# ---------------------------------------------------------------------------- names


@pytest.mark.parametrize("name", [".", "..", "a/b", "..\\x", "a\x00b", "tab\there", "x" * 101, ""])
def test_unsafe_names_are_refused_in_one_line(name):
    with pytest.raises(UnsafeInput) as err:
        safe_name(name, "arms[0].name")
    assert "\n" not in str(err.value) and "arms[0].name" in str(err.value)


def test_env_strings_of_every_family_stay_valid():
    for env in ("minatar:breakout", "HalfCheetah-v5", "procgen:coinrun", "my_pkg.envs:Custom-v0"):
        assert "/" not in env_dirname(env)
    with pytest.raises(UnsafeInput, match="path separator"):
        env_dirname("minatar:../../../../../X/x")


def _study(tmp_path: Path, **over) -> Path:
    d = {"study": "tiny", "base": "minatar/ppo", "envs": ["minatar:breakout"], "seeds": {"count": 1}, "frames": 256,
         "fit": {"data.num_envs": 4, "data.rollout_steps": 16, "data.num_minibatches": 2},
         "arms": [{"name": "ppo", "label": "PPO", "fit": {"model.lr": 0.001}},
                  {"name": "ppo_hi", "label": "PPO hi", "fit": {"model.lr": 0.002}}]}
    d.update(over)
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(d))
    return path


def _space(tmp_path: Path, **over) -> Path:
    d = {"tuning": "tiny", "base": "minatar/ppo", "env": "minatar:breakout", "frames": 256, "trials": 2, "members": 2,
         "fit": {"data.num_envs": 4, "data.rollout_steps": 16, "data.num_minibatches": 2},
         "params": {"model.lr": {"type": "float", "low": 0.0005, "high": 0.016, "log": True}}}
    d.update(over)
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(d))
    return path


@pytest.mark.parametrize("change, words", [
    ({"study": ".."}, "study: '..' is not a name"),
    ({"envs": ["minatar:../../../../../X/x"]}, "path separator"),
    ({"arms": [{"name": "a" * 300, "label": "long"}]}, "longer than 64 bytes"),
])
def test_traversal_and_long_names_in_a_study_are_one_line_before_anything_runs(tmp_path, capsys, change, words):
    from ppo_lightning.cli.main import main

    assert main(["study", "run", str(_study(tmp_path, **change)), "--run-root", str(tmp_path / "root")]) == 2
    line = one_error_line(capsys.readouterr().out)
    assert words in line, line
    assert not (tmp_path / "root").exists() and not list(tmp_path.parent.glob("X"))


def test_a_search_named_dotdot_is_refused(tmp_path, capsys):
    from ppo_lightning.cli.main import main

    assert main(["tune", "--space", str(_space(tmp_path, tuning="..")), "--summary-only"]) == 2
    assert "tuning: '..' is not a name" in one_error_line(capsys.readouterr().out)


# ---------------------------------------------------------------------------- bounded YAML


def test_an_alias_bomb_is_one_line_within_a_second(tmp_path, capsys):
    """study status, tune --summary-only and fit --config on a billion-laughs file: one line each; the
    refusal itself well within a second and a few MB (the bomb would expand to 9**9 strings)."""
    from ppo_lightning.cli.main import main

    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(BOMB)
    t0 = time.perf_counter()
    with pytest.raises(UnsafeInput, match="alias bomb"):
        load_yaml(bomb)
    assert time.perf_counter() - t0 < 1.0
    # the same file as a study, a space and a fit config, in this process
    for argv, stream in ((["study", "status", str(bomb)], "out"), (["study", "run", str(bomb)], "out"),
                         (["study", "report", str(bomb)], "out"), (["tune", "--space", str(bomb)], "out"),
                         (["tune", "--space", str(bomb), "--summary-only"], "out"),
                         (["fit", "--config", str(bomb), "--mlflow.enabled", "false"], "err")):
        t0 = time.perf_counter()
        assert main(argv) == 2, argv
        took = time.perf_counter() - t0
        line = one_error_line(getattr(capsys.readouterr(), stream))
        assert "alias bomb" in line and took < 1.0, (argv, line, took)
    # and as a command of its own: start-up included, bounded memory. The peak is read by a small launcher:
    # Linux carries the pre-exec peak RSS of the forking process into a child's ru_maxrss, so a child forked
    # from this test worker (which trained other tests' runs) would report the worker's peak, not its own.
    launcher = ("import resource, subprocess, sys\n"
                "r = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
                "sys.stderr.write(r.stderr)\n"
                "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
                "print(r.stdout, end='')\n")
    t0 = time.perf_counter()
    run = subprocess.run([sys.executable, "-c", launcher, sys.executable, "-m", "ppo_lightning", "study", "status",
                          str(bomb)], env=ENV, capture_output=True, text=True)
    took = time.perf_counter() - t0
    head, _, stdout = run.stdout.partition("\n")
    returncode, maxrss_kb = (int(v) for v in head.split())
    assert returncode == 2 and "alias bomb" in one_error_line(stdout), run.stdout + run.stderr
    peak_mb = maxrss_kb / 1024
    assert took < 30 and peak_mb < 1000, (took, peak_mb)


# ---------------------------------------------------------------------------- one bounded reader


def _special_files(tmp_path: Path) -> dict[str, Path]:
    """A FIFO, a 1 GB sparse file (no disk used), /dev/zero and a folder: what the reader refuses."""
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    big = tmp_path / "big.yaml"
    with open(big, "wb") as f:
        f.truncate(1 << 30)
    return {"/dev/zero": Path("/dev/zero"), "a FIFO": fifo, "a 1 GB file": big, "a folder": tmp_path}


WHY = {"/dev/zero": "a character device, not a regular file", "a FIFO": "a FIFO (named pipe), not a regular file",
       "a 1 GB file": "1073741824 bytes, more than a settings file may hold", "a folder": "a directory, not a regular file"}


def test_the_reader_refuses_what_is_not_a_bounded_regular_file_before_reading_it(tmp_path):
    from ppo_lightning.core.safety import load_json, read_bytes, read_csv

    for name, path in _special_files(tmp_path).items():
        t0 = time.perf_counter()
        with pytest.raises(UnsafeInput, match=WHY[name].replace("(", r"\(").replace(")", r"\)")):
            load_yaml(path)
        assert time.perf_counter() - t0 < 1.0, name
    small = tmp_path / "small.json"
    small.write_text(json.dumps({"a": [1, 2, 3]}))
    assert load_json(small) == {"a": [1, 2, 3]}
    assert read_bytes(small, max_bytes=len(small.read_bytes())) == small.read_bytes()
    with pytest.raises(UnsafeInput, match=r"16 bytes, more than a settings file may hold \(5\)"):
        read_bytes(small, max_bytes=5)
    with pytest.raises(UnsafeInput, match="more than 4 values"):
        load_json(small, max_values=4)  # the mapping, the list and its three numbers: 5
    assert load_json(small, max_values=5)
    rows = tmp_path / "rows.csv"
    rows.write_text("arm,seed\na,1\nb,2\n")
    assert read_csv(rows) == [{"arm": "a", "seed": "1"}, {"arm": "b", "seed": "2"}]
    with pytest.raises(UnsafeInput, match="more than 3 values, more than a records file may hold"):
        read_csv(rows, max_values=3)
    with pytest.raises(UnsafeInput, match="not JSON"):
        load_json(rows)


def test_a_config_naming_a_fifo_or_a_huge_config_is_refused_before_jsonargparse_opens_it(tmp_path):
    """jsonargparse reads a string where a section goes (``data: data.yaml``) as a nested config, a
    FIFO included (it would wait on it forever): the configs a config names go through the reader."""
    from ppo_lightning.core.configs import read_config

    files = _special_files(tmp_path)
    for name, target in files.items():
        if name == "a folder":
            continue
        cfg = tmp_path / f"cfg_{name.replace(' ', '_').replace('/', '_')}.yaml"
        cfg.write_text(yaml.safe_dump({"data": str(target)}))
        with pytest.raises(UnsafeInput, match=f"data names {target}"):
            read_config(cfg)
    inner = tmp_path / "inner.yaml"
    inner.write_text(yaml.safe_dump({"trainer": {"logger": str(files["a FIFO"])}}))
    outer = tmp_path / "outer.yaml"
    outer.write_text(yaml.safe_dump({"model": "inner.yaml", "trainer": {"default_root_dir": str(tmp_path)}}))
    with pytest.raises(UnsafeInput, match="inner.yaml: trainer.logger names .*fifo.yaml: a FIFO"):
        read_config(outer)  # named beside the config, two levels down; a folder value is left alone
    inner.write_text(yaml.safe_dump({"num_envs": 4}))
    assert read_config(outer)["model"] == "inner.yaml"


@pytest.mark.parametrize("name", ["/dev/zero", "a FIFO", "a 1 GB file"])
def test_a_study_whose_base_is_a_device_a_fifo_or_a_huge_file_is_one_line_in_seconds_and_little_memory(tmp_path, name):
    """Tried as a new user would (issue 63): ``base: /dev/zero`` drove ``study run`` to 23.7 GB. As a
    command of its own (start-up included): one error line, exit 2, within seconds, peak memory under
    200 MB (read by a launcher, as in the alias-bomb test; the child also runs under a 2 GB address-space
    limit, so that a regression fails here instead of starving the machine)."""
    base = _special_files(tmp_path)[name]
    study = _study(tmp_path, base=str(base))
    launcher = ("import resource, subprocess, sys\n"
                "def limit():\n    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
                "r = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=120, preexec_fn=limit)\n"
                "sys.stderr.write(r.stderr)\n"
                "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
                "print(r.stdout, end='')\n")
    t0 = time.perf_counter()
    run = subprocess.run([sys.executable, "-c", launcher, sys.executable, "-m", "ppo_lightning", "study", "run",
                          str(study), "--run-root", str(tmp_path / "root")], env=ENV, capture_output=True, text=True)
    took = time.perf_counter() - t0
    head, _, stdout = run.stdout.partition("\n")
    returncode, maxrss_kb = (int(v) for v in head.split())
    line = one_error_line(stdout)
    assert returncode == 2 and line == f"error: {base}: {WHY[name]}" + (" (4194304)" if name == "a 1 GB file" else
                                                                        "; refusing to read it"), run.stdout + run.stderr
    assert took < 30 and maxrss_kb / 1024 < 200, (took, maxrss_kb / 1024)
    assert not (tmp_path / "root").exists()


def test_a_search_whose_base_is_a_device_or_a_fifo_is_one_line(tmp_path, capsys):
    from ppo_lightning.cli.main import main

    files = _special_files(tmp_path)
    for name in ("/dev/zero", "a FIFO"):
        t0 = time.perf_counter()
        assert main(["tune", "--space", str(_space(tmp_path, base=str(files[name]))), "--run-root", str(tmp_path / "root")]) == 2
        assert one_error_line(capsys.readouterr().out) == f"error: {files[name]}: {WHY[name]}; refusing to read it"
        assert time.perf_counter() - t0 < 10, name
    assert not (tmp_path / "root").exists()


def test_a_study_setting_default_root_dir_is_refused_in_pre_flight(tmp_path, capsys):
    """The worker gives its group a run folder (``--run_dir``); a ``trainer.default_root_dir`` naming
    another is refused by the pre-flight's parse, as the worker would refuse it: one line, no worker."""
    from ppo_lightning.cli.main import main

    path = _study(tmp_path, fit={"data.num_envs": 4, "data.rollout_steps": 16, "data.num_minibatches": 2,
                                 "trainer.default_root_dir": str(tmp_path / "elsewhere")})
    assert main(["study", "run", str(path), "--run-root", str(tmp_path / "root"), "--workers", "1"]) == 2
    line = one_error_line(capsys.readouterr().out)
    assert f"--trainer.default_root_dir {tmp_path / 'elsewhere'} name two run folders" in line, line
    assert "arms ppo, ppo_hi on minatar:breakout as a group of 2 members" in line, line
    assert not (tmp_path / "root/submitit").exists() and not (tmp_path / "root/groups").exists()
    assert not (tmp_path / "elsewhere").exists()


# ---------------------------------------------------------------------------- code from data


def test_code_references_name_what_would_be_imported():
    refs = code_references({"model": {"class_path": "evil.Model", "init_args": {"objective": "evil.obj"}},
                            "data": {"env_id": "evil:Env-v0"}, "trainer.callbacks+": "evil.Callback",
                            "ok": {"env_id": "minatar:breakout", "class_path": "ppo_lightning.training.module.X",
                                   "objective": "clip"}})
    assert [(f, m) for f, _, m in refs] == [("model.class_path", "evil"), ("model.init_args.objective", "evil"),
                                           ("data.env_id", "evil"), ("trainer.callbacks+", "evil")]
    with pytest.raises(UntrustedCode, match="--trust-code"):
        check_code(refs, "x.ckpt")
    check_code(refs, "x.ckpt", trusted=True)
    check_code(refs, "x.ckpt", allowed={"evil.Model", "evil.obj", "evil:Env-v0", "evil.Callback"})


def test_a_checkpoint_and_a_folder_naming_a_module_never_import_it_without_the_opt_in(runs, tmp_path, capsys,
                                                                                     monkeypatch):
    """evaluate (a checkpoint, an exported folder), export-hf's evaluation and fit --ckpt_path: the module
    beside the files is not imported (no marker) and the line says how to allow it; with --trust-code
    it is."""
    from ppo_lightning.cli.main import main

    tmp, store = runs
    monkeypatch.syspath_prepend(str(tmp_path))  # as `python -m ppo_lightning` run next to the files
    name, marker = evil_module(tmp_path)
    env_id = f"{name}:Evil{name}-v0"
    ckpt = _mutate(tmp / "B/checkpoints/last.ckpt", tmp_path / "evil_env.ckpt",
                   lambda c: c["datamodule_hyper_parameters"].update(env_id=env_id))
    capsys.readouterr()
    assert main(["evaluate", str(ckpt), "--episodes", "1"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"would import the module {name!r}" in line and "--trust-code" in line, line
    assert not marker.exists()
    # export-hf: the folder is written, its evaluation is skipped in one line
    assert main(["export-hf", str(ckpt), str(tmp_path / "hf"), "--evaluate", "1", "--no-video"]) == 0
    said = capsys.readouterr()
    assert "no evaluation in the model card (UntrustedCode" in said.out + said.err, said
    assert not marker.exists() and (tmp_path / "hf/config.json").exists()
    assert json.loads((tmp_path / "hf/config.json").read_text())["environment"]["env_id"] == env_id
    assert main(["evaluate", str(tmp_path / "hf"), "--episodes", "1"]) == 2
    assert f"would import the module {name!r}" in one_error_line(capsys.readouterr().err)
    assert not marker.exists()
    # fit --ckpt_path whose hyperparameters name an objective in that module
    obj = _mutate(tmp / "B/checkpoints/last.ckpt", tmp_path / "evil_obj.ckpt",
                  lambda c: c["hyper_parameters"].update(objective=f"{name}.obj"))
    assert main([*FIT, "--mlflow.enabled", "false", "--run_dir", str(tmp_path / "r"), "--ckpt_path", str(obj),
                 "--data.total_frames", "128"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"hyper_parameters.objective '{name}.obj' would import the module {name!r}" in line, line
    assert not marker.exists() and not (tmp_path / "r").exists()
    # the opt-in imports it
    assert main(["evaluate", str(tmp_path / "hf"), "--episodes", "1", "--trust-code"]) == 0
    assert marker.exists()
    capsys.readouterr()


def test_fit_trusts_the_code_the_user_names(runs, tmp_path, capsys, monkeypatch):
    """The same objective typed by the user (command line): the checkpoint's is theirs, it resumes."""
    from ppo_lightning.cli.main import main

    tmp, _ = runs
    monkeypatch.syspath_prepend(str(tmp_path))
    name, marker = evil_module(tmp_path)
    obj = _mutate(tmp / "B/checkpoints/last.ckpt", tmp_path / "own_obj.ckpt",
                  lambda c: c["hyper_parameters"].update(objective=f"{name}.obj"))
    assert main([*FIT, "--mlflow.enabled", "false", "--run_dir", str(tmp_path / "r"), "--ckpt_path", str(obj),
                 "--data.total_frames", "128", "--model.objective", f"{name}.obj"]) == 0
    assert marker.exists()
    capsys.readouterr()


# ---------------------------------------------------------------------------- destinations


def test_a_checkpoint_naming_another_run_folder_never_writes_there(runs, tmp_path, capsys, monkeypatch):
    """B's checkpoint rewritten to name A's folder and MLflow run: resuming it writes nothing in A (its
    config.yaml and checkpoints byte for byte) and appends nothing to A's MLflow run."""
    from mlflow.tracking import MlflowClient

    from ppo_lightning.cli.main import main
    from ppo_lightning.interop.run_folder import read_tracking_state

    tmp, store = runs
    a_state = read_tracking_state(tmp / "A/checkpoints/last.ckpt")
    assert Path(a_state["run_dir"]) == tmp / "A"
    client = MlflowClient(store)
    a_metrics = len(client.get_metric_history(a_state["mlflow_run_id"], "frames"))
    before = {p: p.read_bytes() for p in (tmp / "A").rglob("*") if p.is_file()}
    evil = _mutate(tmp / "B/checkpoints/last.ckpt", tmp / "B/checkpoints/evil.ckpt",
                   lambda c: c["callbacks"]["TrackingState"].update(a_state))
    monkeypatch.chdir(tmp_path)  # the default run folder, runs/<experiment>/<time>, lands here
    capsys.readouterr()
    assert main([*FIT, "--ckpt_path", str(evil), "--mlflow.tracking_uri", store, "--mlflow.experiment", "u",
                 "--data.total_frames", "128"]) == 0
    err = capsys.readouterr().err
    assert f"records another run folder ({tmp / 'A'})" in err and "ignored" in err, err[-2000:]
    assert {p: p.read_bytes() for p in (tmp / "A").rglob("*") if p.is_file()} == before
    assert len(client.get_metric_history(a_state["mlflow_run_id"], "frames")) == a_metrics
    assert list((tmp_path / "runs/u").glob("*/checkpoints/last.ckpt"))  # a new folder of its own


def test_default_root_dir_is_honoured_or_refused(tmp_path, capsys):
    from ppo_lightning.cli.main import main

    assert main([*FIT, "--mlflow.enabled", "false", "--trainer.default_root_dir", str(tmp_path / "root")]) == 0
    assert (tmp_path / "root/checkpoints/last.ckpt").exists()
    assert yaml.safe_load((tmp_path / "root/config.yaml").read_text())["trainer"]["default_root_dir"] == str(tmp_path / "root")
    capsys.readouterr()
    assert main([*FIT, "--mlflow.enabled", "false", "--trainer.default_root_dir", str(tmp_path / "x"),
                 "--run_dir", str(tmp_path / "y")]) == 2
    assert "name two run folders" in one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


# ---------------------------------------------------------------------------- symbolic links


def test_planted_symlinks_are_refused_and_their_targets_untouched(tmp_path, capsys):
    from ppo_lightning.cli.main import main
    from ppo_lightning.studies.runner import group_lock

    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").symlink_to(victim)
    assert main([*FIT, "--mlflow.enabled", "false", "--run_dir", str(run)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "config.yaml is a symbolic link" in line and not (run / "checkpoints").exists(), line
    for entry in ("checkpoints", "videos"):  # a linked folder: the checkpoints or videos would land at its target
        other = tmp_path / f"run_{entry}"
        other.mkdir()
        (other / entry).symlink_to(tmp_path, target_is_directory=True)
        assert main([*FIT, "--mlflow.enabled", "false", "--run_dir", str(other)]) == 2
        assert f"{entry} is a symbolic link" in one_error_line(capsys.readouterr().err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "run_checkpoints", "run_videos", "victim.txt"]
    # a group's lock file
    root = tmp_path / "root"
    (root / "groups").mkdir(parents=True)
    (root / "groups/g.lock").symlink_to(victim)
    with pytest.raises(UnsafeInput, match="lock file .* is a symbolic link"):
        group_lock(root, "g")
    with pytest.raises(UnsafeInput):
        open_nofollow(root / "groups/g.lock", os.O_CREAT | os.O_RDWR, "lock")
    assert victim.read_text() == "precious\n"
    # study run refuses the run root before any worker starts
    assert main(["study", "run", str(_study(tmp_path)), "--run-root", str(root)]) == 2
    line = one_error_line(capsys.readouterr().out)
    assert "holds a symbolic link" in line and not (root / "submitit").exists(), line
    assert victim.read_text() == "precious\n"


# ---------------------------------------------------------------------------- payloads


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_payload_is_one_true_line_in_every_command(runs, tmp_path, capsys):
    from ppo_lightning.cli.main import main

    tmp, _ = runs
    marker = tmp_path / "pwned"
    evil = _mutate(tmp / "B/checkpoints/last.ckpt", tmp_path / "payload.ckpt",
                   lambda c: c["hyper_parameters"].update(extra=_Payload(marker)))
    capsys.readouterr()
    for argv in ([*FIT, "--mlflow.enabled", "false", "--run_dir", str(tmp_path / "r"), "--ckpt_path", str(evil)],
                 ["evaluate", str(evil)], ["export-hf", str(evil), str(tmp_path / "hf")]):
        assert main(argv) == 2, argv
        line = one_error_line(capsys.readouterr().err)
        assert "an unsafe pickle (it calls posix.system), refused by torch.load(weights_only=True) and never run" in line, line
        assert "corrupt" not in line and not marker.exists()


def test_nan_and_words_where_numbers_go_are_one_line(tmp_path, capsys):
    from ppo_lightning.cli.main import main

    for arg, words in ((["--model.clip_eps", "nan"], "model.clip_eps: Expected a <class 'float'>. Got value: nan"),
                       (["--model.lr", "inf"], "model.lr: Expected a <class 'float'>. Got value: inf")):
        assert main([*FIT, "--mlflow.enabled", "false", "--run_dir", str(tmp_path / "r"), *arg]) == 2
        assert one_error_line(capsys.readouterr().err) == f"error: {words}"


# ---------------------------------------------------------------------------- study and search pre-flight


@pytest.mark.parametrize("arm_fit, words", [
    ({"model.lr": "fast"}, "arm bad on minatar:breakout: model.lr: Expected a <class 'float'>. Got value: fast"),
    ({"model.lr": float("nan")}, "arm bad: model.lr is nan, not a finite number"),
    ({"model.nope": 1}, "arm bad on minatar:breakout: --model.nope: ppo_lightning.training.module.PPOLightningModule has no setting 'nope'"),
    ({"data.num_envs": 0}, "arm bad on minatar:breakout: data.num_envs"),
])
def test_study_run_checks_every_arm_before_any_worker_starts(tmp_path, capsys, arm_fit, words):
    from ppo_lightning.cli.main import main

    arms = [{"name": "ok", "label": "OK"}, {"name": "bad", "label": "Bad", "fit": arm_fit}]
    assert main(["study", "run", str(_study(tmp_path, arms=arms)), "--run-root", str(tmp_path / "root")]) == 2
    line = one_error_line(capsys.readouterr().out)
    assert words in line, line
    assert not (tmp_path / "root").exists()  # no worker, no folder


def test_study_run_checks_the_groups_it_would_launch(tmp_path, capsys):
    """Arms that pack into one vectorized group that fit refuses (members carrying their own lr under
    SGD, whose step has no per-member lr): refused in one line naming the arms before any worker
    starts (the workers would each fail with it)."""
    from ppo_lightning.cli.main import main

    path = _study(tmp_path, base="cartpole/ppo", envs=["CartPole-v1"], seeds={"count": 2},
                  fit={"data.num_envs": 4, "data.rollout_steps": 16, "data.num_minibatches": 2, "model.optimizer": "sgd"})
    assert main(["study", "run", str(path), "--run-root", str(tmp_path / "root"), "--workers", "1"]) == 2
    line = one_error_line(capsys.readouterr().out)
    assert "arms ppo, ppo_hi on CartPole-v1 as a group of 4 members: " in line, line
    assert "need model.optimizer adam" in line, line
    assert not (tmp_path / "root/submitit").exists()


def test_study_run_bad_env_code_workers_and_run_root(tmp_path, capsys, monkeypatch):
    from ppo_lightning.cli.main import main

    monkeypatch.syspath_prepend(str(tmp_path))
    name, marker = evil_module(tmp_path)
    cases = [
        (["--run-root", str(tmp_path / "r1")], {"envs": ["NoSuchEnv-v0"]}, 2, "unknown gymnasium environment 'NoSuchEnv-v0'"),
        (["--run-root", str(tmp_path / "r2")], {"envs": [f"{name}:Evil{name}-v0"]}, 2,
         f"envs[0] '{name}:Evil{name}-v0' would import the module {name!r}"),
        (["--workers", "0"], {}, 2, "--workers must be >= 1, got 0"),
        (["--run-root", str(tmp_path / "study.yaml" / "root")], {}, 4, "study run root"),
    ]
    for extra, change, code, words in cases:
        assert main(["study", "run", str(_study(tmp_path, **change)), *extra]) == code, (extra, change)
        line = one_error_line(capsys.readouterr().out)
        assert words in line, line
    assert not marker.exists() and not (tmp_path / "r1").exists() and not (tmp_path / "r2").exists()


def test_tune_checks_its_trials_before_any_worker_starts(tmp_path, capsys, monkeypatch):
    from ppo_lightning.cli.main import main

    monkeypatch.syspath_prepend(str(tmp_path))
    name, marker = evil_module(tmp_path)
    cases = [
        ({"env": f"{name}:Evil{name}-v0"}, 2, f"env '{name}:Evil{name}-v0' would import the module {name!r}"),
        ({"fit": {"data.num_envs": 4, "model.nope": 1}}, 2, "--model.nope: ppo_lightning.training.module.PPOLightningModule has no setting 'nope'"),
        ({"params": {"model.lr": {"type": "float", "low": 0.0005, "high": 0.016, "log": True},
                     "data.update_epochs": {"type": "categorical", "choices": [2, "many"]}}}, 2,
         "a trial with data.update_epochs=many, model.lr=0.0005: data.update_epochs: Expected a <class 'int'>"),
    ]
    for change, code, words in cases:
        assert main(["tune", "--space", str(_space(tmp_path, **change)), "--run-root", str(tmp_path / "root")]) == code
        line = one_error_line(capsys.readouterr().out)
        assert words in line, line
    assert not (tmp_path / "root").exists() and not marker.exists()
    assert main(["tune", "--space", str(_space(tmp_path)), "--run-root", str(tmp_path / "space.yaml" / "x")]) == 4
    assert "search run root" in one_error_line(capsys.readouterr().out)


def test_study_report_into_a_page_without_the_block_is_one_line(tmp_path, capsys):
    from ppo_lightning.cli.main import main

    page = tmp_path / "page.md"
    page.write_text("# a page without the block\n")
    study = ROOT / "experiments/studies/minatar_fig4_500k.yaml"
    assert main(["study", "report", str(study), "--into", str(page), "--out", str(tmp_path / "out"), "--no-plots"]) == 2
    assert "no block" in one_error_line(capsys.readouterr().out)
    assert page.read_text() == "# a page without the block\n"


def test_study_artifacts_stay_in_the_run_root(tmp_path):
    from mlflow.tracking import MlflowClient

    from ppo_lightning.studies.runner import _parent_run
    from ppo_lightning.studies.spec import load_study

    study = load_study(_study(tmp_path))
    root = tmp_path / "root"
    root.mkdir()
    uri = f"sqlite:///{root / 'mlflow.db'}"
    assert _parent_run(study, uri, root) is not None
    location = MlflowClient(uri).get_experiment_by_name(study.name).artifact_location
    assert location.startswith((root / "mlruns").as_uri()), location
    assert (root / "mlruns").exists() and not (tmp_path / "mlruns").exists()
