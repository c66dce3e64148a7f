"""Issue 12: runs that read like Lightning runs (MLflow by frames, resume into the same run, quiet)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from ppo_lightning.cli.fit import main

ROOT = Path(__file__).resolve().parents[1]

ARGS = ["fit", "--config", str(ROOT / "ppo_lightning/configs/cartpole/ppo.yaml"), "--data.num_envs", "2", "--data.rollout_steps", "16",
        "--data.num_minibatches", "2", "--data.update_epochs", "1", "--checkpoint_every", "2",
        "--trainer.enable_progress_bar", "false"]


def test_mlflow_frames_resume_same_run_uploads_last_only(tmp_path, capfd):
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_dir = tmp_path / "run"
    common = [*ARGS, "--mlflow.tracking_uri", uri, "--mlflow.experiment", "t"]
    assert main([*common, "--data.total_frames", "96", "--run_dir", str(run_dir), "--video_every", "2"]) == 0  # 3 its
    out = capfd.readouterr()
    for noise in ("litlogger", "LeafSpec", "Updating database tables", "Creating it"):
        assert noise not in out.out + out.err
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert ckpts == ["iteration-00002.ckpt", "last.ckpt"]  # the progress bar's 1-based iteration numbers

    client = mlflow.MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("t").experiment_id])
    assert client.get_experiment_by_name("t").tags["mlflow.experimentKind"] == "custom_model_development"
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "frames")]
    assert steps == [32, 64, 96]  # x-axis: environment frames
    # --video_every 2: iteration 2 and the end of fit, in the run folder and in MLflow
    videos = sorted(p.name for p in (run_dir / "videos").iterdir())
    assert videos == ["iteration-00002.mp4", "iteration-00003.mp4"]
    assert {a.path for a in client.list_artifacts(run.info.run_id, "videos")} == {f"videos/{v}" for v in videos}
    from ppo_lightning.interop.video import read_mp4

    assert read_mp4(run_dir / "videos" / videos[-1]).shape[1:] == (400, 600, 3)
    last = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["RolloutDataModule"]["frames"] == 96  # the end of training, not the last periodic save
    assert last["callbacks"]["TrackingState"] == {"mlflow_run_id": run.info.run_id, "run_dir": str(run_dir)}

    # resume: the same MLflow run and run folder, metrics continue on the frames axis
    assert main([*common, "--data.total_frames", "160", "--ckpt_path", str(run_dir / "checkpoints" / "last.ckpt")]) == 0
    assert "(continued)" in capfd.readouterr().out
    (run,) = client.search_runs([client.get_experiment_by_name("t").experiment_id])
    assert [m.step for m in client.get_metric_history(run.info.run_id, "frames")] == [32, 64, 96, 128, 160]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        "iteration-00002.ckpt", "iteration-00004.ckpt", "last.ckpt"]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "checkpoints")}
    assert artifacts == {"checkpoints/last.ckpt"}  # not the periodic ones

    # --mlflow.run_name asks for a new run
    assert main([*common, "--data.total_frames", "192", "--mlflow.run_name", "fresh", "--run_dir", str(tmp_path / "r2"),
                 "--ckpt_path", str(run_dir / "checkpoints" / "last.ckpt")]) == 0
    assert len(client.search_runs([client.get_experiment_by_name("t").experiment_id])) == 2


def test_return_threshold_waits_for_episodes(tmp_path):
    """CartPole's EarlyStopping config on an env whose episodes outlast the first rollouts
    (Pendulum: 200 steps, rollouts of 16) waits for episodes instead of crashing; so does a
    best-model checkpoint on the same metric."""
    best = tmp_path / "best"
    assert main([*ARGS, "--data.env_id", "Pendulum-v1", "--data.total_frames", "480", "--mlflow.enabled", "false",
                 "--video_every", "null", "--run_dir", str(tmp_path),
                 "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
                 "--trainer.callbacks.monitor=episode/return_mean20", "--trainer.callbacks.mode=max",
                 f"--trainer.callbacks.dirpath={best}"]) == 0
    assert len(list(best.glob("*.ckpt"))) == 1  # saved once episodes had ended


def test_print_config_shows_the_callbacks_and_logger_of_the_run(tmp_path, capsys, monkeypatch):
    import yaml

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(ROOT / "ppo_lightning/configs/cartpole/ppo.yaml"), "--print_config", "--video_every", "5"])
    assert exit_info.value.code == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    paths = [c["class_path"].rsplit(".", 1)[1] for c in cfg["trainer"]["callbacks"]]
    assert paths == ["EarlyStopping", "FramesProgressBar", "TrackingState", "TrainingVideo", "IterationCheckpoint"]
    assert cfg["trainer"]["logger"]["class_path"] == "ppo_lightning.training.tracking.SafeMLFlowLogger"
    assert cfg["data"]["seed"] == cfg["seed_everything"] == 1  # seed_everything seeds the envs
    assert list(tmp_path.iterdir()) == []  # nothing created: no store, no run folder


def test_experiment_is_tagged_as_model_training(tmp_path):
    """MLflow 3.x opens untagged experiments in its GenAI view: ours are tagged as model training
    when created, an untagged existing one when used, and a kind the user chose is kept."""
    import mlflow

    from ppo_lightning.training.tracking import probe_tracking_store

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(tracking_uri=uri)
    kind = "mlflow.experimentKind"
    assert probe_tracking_store(uri, "new") is None
    assert client.get_experiment_by_name("new").tags[kind] == "custom_model_development"
    old = client.create_experiment("old")  # an experiment made before the tag (or by hand)
    assert kind not in client.get_experiment(old).tags
    assert probe_tracking_store(uri, "old") is None
    assert client.get_experiment(old).tags[kind] == "custom_model_development"
    mine = client.create_experiment("mine", tags={kind: "genai_development"})
    assert probe_tracking_store(uri, "mine") is None
    assert client.get_experiment(mine).tags[kind] == "genai_development"


def _probe(args):
    from ppo_lightning.training.tracking import probe_tracking_store

    uri, barrier_path, i = args
    Path(f"{barrier_path}.ready{i}").touch()
    while not os.path.exists(barrier_path):  # start together: the race is in the first open
        time.sleep(0.001)
    return probe_tracking_store(uri, "concurrent")


def test_new_sqlite_store_opened_by_concurrent_runs(tmp_path):
    """Parallel sweeps on a fresh mlflow.db: every process gets a working store (without the lock one
    of them failed with "table runs already exists" and trained without tracking)."""
    import multiprocessing as mp

    uri = f"sqlite:///{tmp_path / 'fresh' / 'mlflow.db'}"
    barrier = tmp_path / "go"
    import mlflow

    # spawn, not fork: a fork of the test process (torch's and other threads running) once left a
    # worker waiting forever on a lock held by a thread that the fork did not copy
    with mp.get_context("spawn").Pool(4) as pool:
        pending = pool.map_async(_probe, [(uri, str(barrier), i) for i in range(4)], chunksize=1)
        deadline = time.time() + 60
        while len(list(tmp_path.glob("go.ready*"))) < 4 and time.time() < deadline:
            time.sleep(0.05)
        barrier.touch()
        errors = pending.get(timeout=120)
    assert errors == [None] * 4
    assert len(mlflow.MlflowClient(tracking_uri=uri).search_experiments(filter_string="name = 'concurrent'")) == 1


def _store_dump(db: Path, folder: Path):
    import sqlite3

    with sqlite3.connect(db) as con:
        # each statement's lines as a set: MLflow's own migrations order a table's constraints differently
        # from one new store to the next
        schema = sorted((t, n, frozenset(line.strip().rstrip(",") for line in (sql or "").splitlines()))
                        for t, n, sql in con.execute("SELECT type, name, sql FROM sqlite_master"))
        experiments = [(i, name, str(Path(loc).relative_to(folder)), stage) for i, name, loc, stage in
                       con.execute("SELECT experiment_id, name, artifact_location, lifecycle_stage FROM experiments "
                                   "ORDER BY experiment_id")]
        return schema, experiments, con.execute("SELECT * FROM alembic_version").fetchall()


def test_a_new_sqlite_store_is_a_copy_of_mlflows_empty_one_and_opens_as_mlflow_would_make_it(tmp_path, monkeypatch):
    """The first new store makes the empty one in the cache folder (MLflow's schema, no Default
    experiment); later new stores are copies in well under MLflow's 4-5 s of migrations, and equal a
    store MLflow made itself, Default experiment included (its artifact root is the opening process's).
    An existing store is never replaced."""
    import mlflow

    from ppo_lightning.training.tracking import new_sqlite_store, probe_tracking_store

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for name in ("first", "copied", "by_mlflow"):
        (tmp_path / name).mkdir()
    monkeypatch.chdir(tmp_path / "first")
    assert probe_tracking_store(f"sqlite:///{tmp_path / 'first' / 'mlflow.db'}", "exp") is None
    (template,) = (tmp_path / "cache" / "ppo-lightning").glob("mlflow-*-empty.db")
    assert template.name == f"mlflow-{mlflow.__version__}-empty.db"
    monkeypatch.chdir(tmp_path / "copied")
    t0 = time.perf_counter()
    assert new_sqlite_store(Path("mlflow.db")) and time.perf_counter() - t0 < 1.0
    assert probe_tracking_store(f"sqlite:///{tmp_path / 'copied' / 'mlflow.db'}", "exp") is None
    monkeypatch.chdir(tmp_path / "by_mlflow")  # (MLflow keeps a store per URI: absolute ones, one per folder)
    mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'by_mlflow' / 'mlflow.db'}").create_experiment("exp")
    dumps = {n: _store_dump(tmp_path / n / "mlflow.db", tmp_path / n) for n in ("first", "copied", "by_mlflow")}
    assert dumps["first"] == dumps["copied"] == dumps["by_mlflow"]
    assert [e[1] for e in dumps["copied"][1]] == ["Default", "exp"]
    before = (tmp_path / "copied" / "mlflow.db").read_bytes()
    assert not new_sqlite_store(tmp_path / "copied" / "mlflow.db")  # an existing store: untouched
    assert (tmp_path / "copied" / "mlflow.db").read_bytes() == before
    assert not list((tmp_path / "copied").glob(".mlflow.db.*"))  # no leftover temporary copy


def test_view_hints_fit_the_tracking_uri():
    """A server is opened at the run's own URL; a local store is served by `mlflow ui` first. Both URLs
    carry the model-training view (MLflow's UI keeps its GenAI toggle in the browser otherwise)."""
    from ppo_lightning.training.tracking import view_hints

    assert view_hints("http://127.0.0.1:5055/", "3", "abc") == [
        "  open: http://127.0.0.1:5055/#/experiments/3/runs/abc?workflowType=machine_learning"]
    assert view_hints("sqlite:///mlflow.db", "1", "abc") == [
        "  view with: mlflow ui --backend-store-uri sqlite:///mlflow.db",
        "  then open: http://127.0.0.1:5000/#/experiments/1/runs/abc?workflowType=machine_learning"]


def _chromium() -> str | None:
    import shutil

    return shutil.which("chromium") or shutil.which("chromium-browser")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _page_text(browser: str, url: str, profile: Path) -> str:
    """The text of ``url`` after 15 s of the page's (virtual) time, in a fresh headless Chromium."""
    import html
    import re
    import subprocess

    proc = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-extensions",
         f"--user-data-dir={profile}", "--virtual-time-budget=15000", "--dump-dom", url],
        capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    page = re.sub(r"<script.*?</script>|<style.*?</style>", "", proc.stdout, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", " | ", page))


def test_printed_run_url_opens_the_training_view_in_a_browser(tmp_path, capsys):
    """Train against an MLflow server, open the URL the run prints in a fresh browser: the run's page,
    in the model-training view (the side bar's Runs / Model registry, not the GenAI "Evaluation runs").
    Negative control: the same page without the query opens in the GenAI view (mlflow/mlflow#24498)."""
    import signal
    import subprocess
    import sys
    import urllib.request

    browser = _chromium()
    if browser is None:
        pytest.skip("no Chromium binary (chromium) on this machine: install it with "
                    "`apt-get install -y chromium` (.ci/run does) to open the printed run URL in a browser")
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
         "--default-artifact-root", str(tmp_path / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        uri = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 180
        while True:
            try:
                urllib.request.urlopen(f"{uri}/health", timeout=2)
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "mlflow server did not start"
                time.sleep(0.5)
        assert main([*ARGS, "--data.total_frames", "64", "--mlflow.tracking_uri", uri, "--mlflow.experiment", "t",
                     "--run_dir", str(tmp_path / "run")]) == 0
        lines = [line.strip() for line in capsys.readouterr().out.splitlines()]
        url = next(line.removeprefix("open: ") for line in lines if line.startswith("open: "))
        assert url.startswith(f"{uri}/#/experiments/") and url.endswith("?workflowType=machine_learning"), url
        assert not [line for line in lines if "mlflow ui" in line]  # a server is not served again

        text = _page_text(browser, url, tmp_path / "profile")
        assert "episode/return_mean20" in text, text[:3000]  # the run's own page, with its metrics
        assert "Model registry" in text and "Evaluation runs" not in text, text[:3000]
        genai = _page_text(browser, url.removesuffix("?workflowType=machine_learning"), tmp_path / "profile2")
        assert "Evaluation runs" in genai, genai[:3000]
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)


def test_the_run_folder_is_the_given_one_else_the_resumed_runs_else_runs_experiment_name():
    """One function for the CLI's three uses (the run, --print_config, a requeued SLURM job's resume)."""
    from ppo_lightning.interop.run_folder import run_folder
    from ppo_lightning.training.preemption import run_name

    assert run_folder("given", "exp", "name", "resumed") == Path("given")
    assert run_folder(None, "exp", "name", "resumed") == Path("resumed")
    assert run_folder(None, "exp", "name") == Path("runs/exp/name")
    assert run_name("mine") == "mine"


# ---------------------------------------------------------------------- metrics without MLflow (issue 65)
def _csv(path: Path) -> list[dict[str, str]]:
    import csv

    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_without_mlflow_the_metrics_land_in_the_run_folders_csv_and_a_resume_appends(tmp_path, capsys):
    run_dir = tmp_path / "run"
    common = [*ARGS, "--mlflow.enabled", "false", "--video_every", "null", "--run_dir", str(run_dir)]
    assert main([*common, "--data.total_frames", "96"]) == 0
    assert f"metrics: {run_dir / 'metrics.csv'}" in capsys.readouterr().out
    rows = _csv(run_dir / "metrics.csv")
    assert [r["step"] for r in rows] == ["32", "64", "96"]  # one row per iteration, stepped by frames
    assert [float(r["frames"]) for r in rows] == [32, 64, 96]
    for key in ("episode/return_mean20", "train/clip_fraction", "train/entropy", "time/fps"):
        assert key in rows[0], key
    assert (run_dir / "hparams.yaml").is_file()
    assert "RunCSVLogger" in (run_dir / "config.yaml").read_text()
    # resumed into the same folder: the rows go on (Lightning's writer alone would delete the file)
    assert main([*common, "--data.total_frames", "160", "--ckpt_path", str(run_dir / "checkpoints" / "last.ckpt")]) == 0
    assert [r["step"] for r in _csv(run_dir / "metrics.csv")] == ["32", "64", "96", "128", "160"]


def test_with_mlflow_and_a_logger_of_the_users_the_same_metrics_land_in_both(tmp_path):
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert main([*ARGS, "--mlflow.tracking_uri", uri, "--mlflow.experiment", "t", "--video_every", "null",
                 "--data.total_frames", "64", "--run_dir", str(tmp_path / "run"),
                 "--trainer.logger", "lightning.pytorch.loggers.CSVLogger",
                 "--trainer.logger.save_dir", str(tmp_path / "csv")]) == 0
    rows = _csv(tmp_path / "csv/lightning_logs/version_0/metrics.csv")
    client = mlflow.MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("t").experiment_id])
    logged = set(run.data.metrics)
    assert logged == set(rows[0]) - {"step"} and len(logged) > 20
    for key in ("train/entropy", "frames"):
        history = client.get_metric_history(run.info.run_id, key)
        assert [(m.step, m.value) for m in history] == [(int(r["step"]), pytest.approx(float(r[key]))) for r in rows]
    assert not (tmp_path / "run" / "metrics.csv").exists()  # asked for one CSV: the user's


def test_the_mlflow_guides_logger_commands_run_as_printed(tmp_path, monkeypatch, capsys):
    """docs/guides/mlflow.md, "Metrics without MLflow, and other loggers": each command runs (on a tiny
    budget, in a temporary folder) and writes its metrics where the page says; TensorBoard's needs
    the tensorboard package."""
    import re
    import shlex

    page = (ROOT / "docs/guides/mlflow.md").read_text()
    section = page.split("## Metrics without MLflow, and other loggers", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(\w+)\n(.*?)```", section, re.S)
    commands = [shlex.split(code.strip()) for lang, code in blocks if lang == "bash"]
    assert len(commands) == 3 and all(c[:2] == ["ppo-lightning", "fit"] for c in commands)
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for argv in commands:
        if "lightning.pytorch.loggers.TensorBoardLogger" in argv and not any(
                __import__("importlib").util.find_spec(m) for m in ("tensorboard", "tensorboardX")):
            continue  # pip install tensorboard: not a dependency of the project
        tiny = [*ARGS[3:], "--data.total_frames", "64", "--video_every", "null", "--mlflow.tracking_uri", uri]
        assert main([*argv[1:], *tiny]) == 0, argv
    out = capsys.readouterr().out
    assert f"metrics: {tmp_path / 'runs/csv/metrics.csv'}" in out and "metrics: .../runs/csv/metrics.csv" in section
    assert len(_csv(tmp_path / "runs/csv/metrics.csv")) == 2
    assert len(_csv(tmp_path / "runs/both/csv/lightning_logs/version_0/metrics.csv")) == 2
    assert not (tmp_path / "runs/both/metrics.csv").exists()
