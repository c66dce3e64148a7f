"""Faults of the machine (issue 38), made for real: a read-only mount, a small tmpfs that fills, an
MLflow server process killed and restarted. Mounting needs root (CI runs as root); elsewhere the
mount tests skip with the reason."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest
import torch

from ppo_lightning.cli.fit import main

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--trainer.enable_progress_bar", "false", "--data.num_envs", "4", "--data.rollout_steps", "16",
        "--data.num_minibatches", "2", "--data.update_epochs", "1", "--video_every", "null"]
EWMA = ["fit", "--config", str(ROOT / "ppo_lightning/configs/cartpole/ppo_ewma.yaml"), *TINY]


def _mount(folder: Path, options: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip(f"mount -t tmpfs is not permitted here ({(out.stderr or out.stdout).strip()[:200]})")


@pytest.fixture
def mount(tmp_path):
    """``mount(name, options)``: a tmpfs at tmp_path/name, unmounted at teardown."""
    mounted: list[Path] = []

    def make(name: str, options: str) -> Path:
        folder = tmp_path / name
        _mount(folder, options)
        mounted.append(folder)
        return folder

    yield make
    for folder in reversed(mounted):
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    return lines[0]


# ---------------------------------------------------------------------------- pre-flight (exit code 4)


def test_read_only_run_folder_store_and_export_target_are_refused_before_training(tmp_path, mount, capsys,
                                                                                  monkeypatch):
    ro = mount("ro", "size=1m,ro")
    monkeypatch.chdir(tmp_path)
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cases = [
        (["--run_dir", str(ro / "run"), "--mlflow.tracking_uri", store],
         f"error: run folder {ro / 'run'} cannot be written (Read-only file system); nothing was trained or written; "
         "choose another with --run_dir"),
        (["--run_dir", str(tmp_path / "run"), "--mlflow.tracking_uri", f"sqlite:///{ro / 'mlflow.db'}"],
         f"error: MLflow tracking store folder {ro} cannot be written (Read-only file system)"),
    ]
    for args, message in cases:
        assert main([*EWMA, "--data.total_frames", "64", *args]) == 4, args
        line = _one_error_line(capsys.readouterr().err)
        assert line.startswith(message), line
    assert not (tmp_path / "run" / "checkpoints").exists() or not any((tmp_path / "run" / "checkpoints").iterdir())

    # an experiment whose artifact folder (fixed at its creation: ./mlruns of that day's folder) is read-only
    monkeypatch.chdir(ro)
    from ppo_lightning.training.tracking import probe_tracking_store

    assert probe_tracking_store(store, "made-in-ro") is None  # the store itself is writable
    monkeypatch.chdir(tmp_path)
    assert main([*EWMA, "--data.total_frames", "64", "--run_dir", str(tmp_path / "run2"),
                 "--mlflow.tracking_uri", store, "--mlflow.experiment", "made-in-ro"]) == 4
    line = _one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: MLflow artifact folder of experiment 'made-in-ro', {ro / 'mlruns'}"), line

    # export-hf into a read-only folder: refused before the checkpoint is read or anything evaluated
    assert main([*EWMA, "--data.total_frames", "64", "--run_dir", str(tmp_path / "ok"), "--mlflow.enabled", "false"]) == 0
    from ppo_lightning.cli.main import main as cli

    capsys.readouterr()
    assert cli(["export-hf", str(tmp_path / "ok/checkpoints/last.ckpt"), str(ro / "hf"), "--evaluate", "0"]) == 4
    line = _one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: export folder {ro} cannot be written (Read-only file system)"), line


# ---------------------------------------------------------------------------- disk full (exit code 5)


def _fill(folder: Path, leave: int) -> Path:
    """A file that leaves about ``leave`` bytes free on the file system of ``folder``."""
    import shutil

    filler = folder / "filler"
    free = shutil.disk_usage(folder).free
    with open(filler, "wb") as f:
        f.write(b"\0" * max(0, free - leave))
    return filler


def test_disk_full_during_a_checkpoint_ends_in_one_line_and_the_printed_command_resumes(tmp_path, mount, capsys):
    """A 3 MB tmpfs run folder, filled to about 2.5 checkpoints of free space: the third checkpoint
    write fails. One line (what, bytes needed, last good checkpoint, resume command), exit code 5, no
    temporary file, the MLflow run FAILED with the reason as a tag; after freeing space the printed
    command resumes and finishes."""
    import mlflow

    disk = mount("disk", "size=3m")
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = [*EWMA, "--checkpoint_every", "1", "--data.total_frames", str(8 * 64), "--run_dir", str(disk / "run"),
            "--mlflow.tracking_uri", store, "--mlflow.experiment", "full"]
    assert main([*args[:-6], "--mlflow.enabled", "false", "--data.total_frames", "64",
                 "--run_dir", str(tmp_path / "probe")]) == 0
    size = (tmp_path / "probe/checkpoints/last.ckpt").stat().st_size
    filler = _fill(disk, int(2.5 * size) + 8192)  # config.yaml, folders
    capsys.readouterr()
    assert main(args) == 5
    line = _one_error_line(capsys.readouterr().err)
    ckpts = disk / "run/checkpoints"
    assert line.startswith("error: no space left on device while writing checkpoint "), line
    import re

    needed = float(re.search(r"\(needs ([0-9.]+) kB, [0-9.]+ kB free\)", line).group(1)) * 1e3
    assert abs(needed - size) < 0.02 * size, (needed, size)  # the checkpoint's bytes
    last_good = ckpts / "last.ckpt"
    assert f"nothing partial was left; the last good checkpoint is {last_good}; free space, then resume with: " \
           "ppo-lightning fit " in line, line
    assert not list(ckpts.glob(".*tmp")) and not list(ckpts.glob(".*.tmp*"))
    saved = torch.load(last_good, weights_only=True)["RolloutDataModule"]["iteration"]
    assert saved >= 1

    client = mlflow.MlflowClient(tracking_uri=store)
    (run,) = client.search_runs([client.get_experiment_by_name("full").experiment_id])
    assert run.info.status == "FAILED"
    assert run.data.tags["stopped_by"].startswith("StorageFull (exit code 5): no space left on device while writing")

    filler.unlink()  # free space, then run the printed command
    command = shlex.split(line.split("resume with: ", 1)[1])
    assert command[:2] == ["ppo-lightning", "fit"]
    assert main(command[1:]) == 0
    assert torch.load(last_good, weights_only=True)["RolloutDataModule"]["iteration"] == 8
    (run,) = client.search_runs([client.get_experiment_by_name("full").experiment_id])
    assert run.info.status == "FINISHED"  # the same MLflow run, continued
    assert [m.step for m in client.get_metric_history(run.info.run_id, "frames")] == [64 * i for i in range(1, 9)]


# ---------------------------------------------------------------------------- tracking server away


import json
import signal
import socket
import sys
import time

from lightning.pytorch import Callback


class Outage(Callback):
    """Test helper (named on the command line): at iteration ``kill_at`` SIGKILLs the MLflow server
    whose pid is in ``pid_file``; at iteration ``wait_at`` waits until ``health`` answers (the
    server restarted by the test); sleeps ``pace_s`` per iteration; appends each iteration's end time
    to ``times``."""

    def __init__(self, times: str, pid_file: str = "", kill_at: int = 0, wait_at: int = 0, health: str = "",
                 pace_s: float = 0.0) -> None:
        self.times, self.pid_file, self.kill_at, self.wait_at = times, pid_file, kill_at, wait_at
        self.health, self.pace_s = health, pace_s

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        it = trainer.datamodule.iteration
        if it == self.kill_at:
            os.killpg(int(Path(self.pid_file).read_text()), signal.SIGKILL)  # the server and its workers
        waited = 0.0
        if it == self.wait_at:
            t0 = time.monotonic()
            _wait_healthy(self.health, 180)
            waited = time.monotonic() - t0
        with open(self.times, "a") as f:
            f.write(json.dumps({"iteration": it, "t": time.monotonic(), "waited": waited}) + "\n")
        time.sleep(self.pace_s)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


def _wait_healthy(url: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _healthy(url):
            return True
        time.sleep(0.2)
    return False


def _start_server(db: Path, port: int, log: Path, pid_file: Path) -> subprocess.Popen:
    mlflow_bin = Path(sys.executable).with_name("mlflow")
    proc = subprocess.Popen([str(mlflow_bin), "server", "--backend-store-uri", f"sqlite:///{db}", "--host", "127.0.0.1",
                             "--port", str(port), "--workers", "1", "--default-artifact-root", str(db.parent / "artifacts")],
                            stdout=open(log, "a"), stderr=subprocess.STDOUT, start_new_session=True)
    pid_file.write_text(str(proc.pid))
    return proc


def _stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def test_tracking_server_killed_and_restarted_never_holds_training_and_the_run_is_complete(tmp_path, capfd):
    """A real ``mlflow server`` SIGKILLed in the middle of run A (A finishes while it is away: one line
    when it goes, its records kept in the spool), restarted while run B resumes A's checkpoint (B
    starts with the server unreachable, one line when it is back): no iteration waited on the
    server, and the server ends with one FINISHED run holding every iteration's metrics once."""
    import mlflow

    port = _free_port()
    uri, health = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port}/health"
    db, log, pid_file, times = tmp_path / "server.db", tmp_path / "server.log", tmp_path / "server.pid", tmp_path / "t.jsonl"
    server = _start_server(db, port, log, pid_file)
    try:
        if not _wait_healthy(health, 150):
            pytest.skip(f"mlflow server did not start within 150 s: {log.read_text()[-500:]}")
        run_dir = tmp_path / "run"
        base = [*EWMA, "--checkpoint_every", "1", "--run_dir", str(run_dir), "--mlflow.tracking_uri", uri,
                "--mlflow.experiment", "outage", "--data.num_envs", "2"]
        outage = {"class_path": "test_machine_faults.Outage",
                  "init_args": {"times": str(times), "pid_file": str(pid_file), "kill_at": 2, "pace_s": 0.1}}
        capfd.readouterr()
        assert main([*base, "--data.total_frames", str(8 * 32), f"--trainer.callbacks+={json.dumps(outage)}"]) == 0
        err = capfd.readouterr().err
        assert err.count(f"MLflow tracking server {uri} is unreachable") == 1, err[-3000:]
        spool = run_dir / "checkpoints/mlflow-spool.jsonl"
        assert f"records kept in {spool}" in err and spool.exists(), err[-3000:]
        ends = [json.loads(line)["t"] for line in times.read_text().splitlines()]
        gaps = [b - a - 0.1 for a, b in zip(ends, ends[1:])]
        assert max(gaps) < 2.0, gaps  # no iteration waited on the dead server

        server.wait(timeout=30)
        server = _start_server(db, port, log, pid_file)  # restarting while run B trains
        times.unlink()
        wait = {"class_path": "test_machine_faults.Outage",
                "init_args": {"times": str(times), "wait_at": 10, "health": health, "pace_s": 0.5}}
        ckpt = run_dir / "checkpoints/last.ckpt"
        assert main([*base, "--data.total_frames", str(20 * 32), "--ckpt_path", str(ckpt),
                     f"--trainer.callbacks+={json.dumps(wait)}"]) == 0
        err = capfd.readouterr().err
        assert err.count("is unreachable at start") == 1 and err.count(f"MLflow tracking server {uri} is back") == 1, \
            err[-3000:] + times.read_text() + log.read_text()[-1500:]
        assert not spool.exists()
        client = mlflow.MlflowClient(tracking_uri=uri)
        (run,) = client.search_runs([client.get_experiment_by_name("outage").experiment_id])
        assert run.info.status == "FINISHED"
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "frames")) == \
            [32 * i for i in range(1, 21)]
        assert torch.load(ckpt, weights_only=True)["callbacks"]["TrackingState"]["mlflow_run_id"] == run.info.run_id
    finally:
        _stop(server)


def test_spool_of_a_server_never_reached_imports_into_a_new_run(tmp_path, capfd):
    """A run whose server never answered (a closed port): the sender keeps every record (run creation,
    parameters, metrics, status) in the spool, and the printed import command sends them to a store."""
    import mlflow

    from ppo_lightning.training.mlflow_sender import main as import_main
    from ppo_lightning.training.tracking import SafeMLFlowLogger

    uri = f"http://127.0.0.1:{_free_port()}"
    spool = tmp_path / "checkpoints/mlflow-spool.jsonl"
    logger = SafeMLFlowLogger("never", uri, run_name="r", spool=str(spool))
    logger.log_hyperparams({"lr": 0.1})
    t0 = time.monotonic()
    for i in range(1, 4):
        logger.log_metrics({"frames": 32.0 * i, "episode/return_mean20": float(i)})
    assert time.monotonic() - t0 < 0.5  # never waits
    logger.finalize("success")
    err = capfd.readouterr().err
    assert err.count(f"MLflow tracking server {uri} is unreachable (connection refused)") == 1, err
    assert f"6 records kept in {spool}; a run resumed from this folder sends them, or now: " \
           f"python -m ppo_lightning.training.mlflow_sender {spool}" in err, err
    store = f"sqlite:///{tmp_path / 'm.db'}"
    assert import_main([str(spool), "--tracking_uri", store]) == 0
    assert not spool.exists()
    client = mlflow.MlflowClient(tracking_uri=store)
    (run,) = client.search_runs([client.get_experiment_by_name("never").experiment_id])
    assert run.info.run_name == "r" and run.info.status == "FINISHED" and run.data.params["lr"] == "0.1"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "frames")] == [32, 64, 96]


def test_full_disk_under_videos_and_mlflow_artifacts_warns_once_and_training_goes_on(tmp_path, mount, capfd,
                                                                                      monkeypatch):
    """Videos and artifact uploads are not needed to go on: a full disk under each is said once, no
    partial file is left, and the run finishes with every metric and its checkpoints."""
    import mlflow

    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "run"
    videos, artifacts = mount("run/videos", "size=1m"), mount("mlruns", "size=1m")
    _fill(videos, 4096)
    _fill(artifacts, 12 * 1024)  # the pre-flight probe and config.yaml fit, a checkpoint does not
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert main([*EWMA, "--data.total_frames", str(3 * 64), "--video_every", "1", "--run_dir", str(run_dir),
                 "--mlflow.tracking_uri", store, "--mlflow.experiment", "art"]) == 0
    err = capfd.readouterr().err
    assert err.count("no space left on device while writing video") == 1, err[-3000:]
    assert err.count("no space left on device while storing artifact") == 1, err[-3000:]
    assert "no more videos in this run; training goes on" in err
    assert sorted(p.name for p in videos.iterdir()) == ["filler"]  # no partial video
    client = mlflow.MlflowClient(tracking_uri=store)
    (run,) = client.search_runs([client.get_experiment_by_name("art").experiment_id])
    assert run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "frames")] == [64, 128, 192]
    partial = [p for p in artifacts.rglob("*") if p.is_file() and p.name != "filler" and p.stat().st_size == 0]
    assert not list(artifacts.rglob("last.ckpt")) and not partial
    assert (run_dir / "checkpoints/last.ckpt").exists()


_KILLED_SENDER = """
import json, os, signal, sys
import mlflow
from ppo_lightning.training.mlflow_sender import MlflowSender, configure_http

spool, uri, sent_log = sys.argv[1:4]
configure_http()
client = mlflow.MlflowClient(tracking_uri=uri)
log_batch = client.log_batch

def counted(run_id, metrics=(), **kw):
    log_batch(run_id, metrics=metrics, **kw)  # the server has it ...
    if metrics:
        with open(sent_log, "a") as f:
            f.write(json.dumps(sorted({m.step for m in metrics})) + "\\n")
        if sum(1 for _ in open(sent_log)) == 3:
            os.kill(os.getpid(), signal.SIGKILL)  # ... and the sender dies before it notes so

client.log_batch = counted
sender = MlflowSender(client, uri, None, spool, local=False)
for i in range(41, 46):  # taken while the backlog is being sent: kept on disk too
    sender.submit({"kind": "metrics", "step": i, "timestamp": 1000 + i, "metrics": {"frames": float(i), **{f"m/{k}": i + k for k in range(49)}}})
sender.flush(120)
"""


def test_sender_killed_while_sending_the_backlog_resends_nothing_and_loses_nothing(tmp_path, monkeypatch, capfd):
    """A spool of 40 iterations (the server was away, the run never created) is being sent to a real
    ``mlflow server`` when the sender is SIGKILLed right after the server took its third metrics batch
    (before the sender could note it), while 5 new iterations wait behind the backlog. The next sender
    creates no second run, sends no (metric, step) the server already has, and delivers all 45."""
    import mlflow

    from ppo_lightning.training.mlflow_sender import MlflowSender, load_spool

    def metrics(i):
        return {"kind": "metrics", "step": i, "timestamp": 1000 + i,
                "metrics": {"frames": float(i), **{f"m/{k}": i + k for k in range(49)}}}

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # as SafeMLFlowLogger sets it: the sender retries
    spool, sent_log = tmp_path / "checkpoints/mlflow-spool.jsonl", tmp_path / "sent.jsonl"
    away = MlflowSender(mlflow.MlflowClient(tracking_uri=f"http://127.0.0.1:{_free_port()}"),
                        f"http://127.0.0.1:{_free_port()}", None, spool, local=False, away=True)
    for record in [{"kind": "create_run", "experiment": "killed", "tags": {"mlflow.runName": "r"}},
                   {"kind": "params", "params": {"lr": "0.1"}}, *map(metrics, range(1, 41))]:
        away.submit(record)
    away.stop()
    assert away.persist() == 42

    port = _free_port()
    uri, health = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port}/health"
    server = _start_server(tmp_path / "server.db", port, tmp_path / "server.log", tmp_path / "server.pid")
    try:
        if not _wait_healthy(health, 150):
            pytest.skip(f"mlflow server did not start within 150 s: {(tmp_path / 'server.log').read_text()[-500:]}")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        out = subprocess.run([sys.executable, "-c", _KILLED_SENDER, str(spool), uri, str(sent_log)], env=env,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == -signal.SIGKILL, out.stderr[-3000:]
        first = [step for line in sent_log.read_text().splitlines() for step in json.loads(line)]
        assert first == list(range(1, 16)), first  # batches of 250 values: 5 iterations each
        header, unsent = load_spool(spool)
        assert header["run_id"] is not None and [r["step"] for r in unsent] == list(range(11, 46))

        client = mlflow.MlflowClient(tracking_uri=uri)
        log_batch, second = client.log_batch, []
        client.log_batch = lambda run_id, metrics=(), **kw: (second.extend(m.step for m in metrics if m.key == "frames"),
                                                             log_batch(run_id, metrics=metrics, **kw))
        capfd.readouterr()
        resumed = MlflowSender(client, uri, None, spool, local=False)
        assert f"MLflow: 35 records kept in {spool} by an earlier run; sending them first" in capfd.readouterr().err
        assert resumed.flush(120)
        resumed.stop()
        assert second == list(range(16, 46)) and not spool.exists()
        (run,) = client.search_runs([client.get_experiment_by_name("killed").experiment_id])
        assert run.info.run_name == "r" and run.data.params == {"lr": "0.1"}
        history = client.get_metric_history(run.info.run_id, "frames")
        assert sorted(m.step for m in history) == list(range(1, 46))
    finally:
        _stop(server)


# ---------------------------------------------------------------------------- disk full under data parallelism


class FillDisk(Callback):
    """Test helper (named on the command line): on global rank 0, at the end of iteration ``at`` (before
    that iteration's checkpoint is written), fills the file system of ``folder`` to leave half the size
    of the newest checkpoint there (file or sharded folder) free: the next checkpoint write runs out of space."""

    def __init__(self, folder: str, at: int = 2) -> None:
        self.folder, self.at = folder, at

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if trainer.datamodule.iteration == self.at and trainer.global_rank == 0:
            from ppo_lightning.core.storage import tree_bytes

            folder = Path(self.folder)
            newest = max((p for p in folder.rglob("*.ckpt") if not p.name.startswith(".")),
                         key=lambda p: p.stat().st_mtime)
            _fill(folder, tree_bytes(newest) // 2)


def _run_ranks(args: list[str], timeout_s: float) -> tuple[int, str, float]:
    """``ppo-lightning fit`` with its ranks in a new session: (exit code, stderr, seconds); fails if a
    rank is still alive ``timeout_s`` after the start (killing them all)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "ppo_lightning.cli.main", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=timeout_s)
        while time.monotonic() - t0 < timeout_s:  # the other ranks (Lightning's subprocesses) leave too
            alive = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _session(p) == proc.pid]
            if not alive:
                return proc.returncode, err, time.monotonic() - t0
            time.sleep(0.2)
        raise AssertionError(f"a rank was still running {timeout_s} s after the start:\n{err[-3000:]}")
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        raise AssertionError(f"rank 0 did not end within {timeout_s} s (hang):\n{err[-3000:]}") from None
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _session(proc_dir: Path) -> int | None:
    try:
        stat = (proc_dir / "stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[3])  # the fields after the name: state, ppid, pgrp, session
    except (OSError, IndexError, ValueError):
        return None


DDP = ["fit", "--config", str(ROOT / "ppo_lightning/configs/cartpole/ppo_ewma.yaml"), *TINY, "--trainer.accelerator",
       "cpu", "--trainer.devices", "2", "--data.num_threads", "1", "--mlflow.enabled", "false",
       "--checkpoint_every", "1", "--data.total_frames", str(4 * 128)]


def test_disk_full_at_a_ddp_checkpoint_ends_every_rank_in_one_line(tmp_path, mount):
    """2 DDP ranks (gloo, CPU), the run folder on a tmpfs that fills before iteration 2's checkpoint:
    rank 0's write fails while rank 1 waits at the save's barrier. Every rank leaves (none hangs)
    with exit code 5 and one line naming the last good checkpoint; no partial file is left."""
    disk = mount("disk", "size=4m")
    fill = {"class_path": "test_machine_faults.FillDisk", "init_args": {"folder": str(disk), "at": 2}}
    code, err, seconds = _run_ranks([*DDP, "--trainer.strategy", "ddp", "--run_dir", str(disk / "run"),
                                     f"--trainer.callbacks+={json.dumps(fill)}"], timeout_s=300)
    assert code == 5, err[-3000:]
    line = _one_error_line(err)
    ckpts = disk / "run/checkpoints"
    assert line.startswith(f"error: no space left on device while writing checkpoint {ckpts}/"), line
    assert f"the last good checkpoint is {ckpts / 'last.ckpt'}; free space, then resume with: ppo-lightning fit" in line
    assert sorted(p.name for p in ckpts.iterdir()) == ["iteration-00001.ckpt", "last.ckpt"]
    assert torch.load(ckpts / "last.ckpt", weights_only=True)["RolloutDataModule"]["iteration"] == 1


def test_disk_full_at_an_fsdp2_sharded_checkpoint_ends_every_rank_in_one_line(tmp_path, mount):
    """FSDP2 over 2 gloo ranks, each writing its shard of iteration 2's checkpoint folder on a tmpfs that
    fills first: exit code 5 and one line naming the last good (complete) sharded checkpoint; no
    temporary or partial folder is left for a resume to pick."""
    from ppo_lightning.interop.checkpoint_io import check_checkpoint_file, last_good_checkpoint

    disk = mount("disk", "size=4m")
    fill = {"class_path": "test_machine_faults.FillDisk", "init_args": {"folder": str(disk), "at": 2}}
    code, err, seconds = _run_ranks([*DDP, "--trainer.strategy", "lightning.pytorch.strategies.ModelParallelStrategy",
                                     "--trainer.strategy.data_parallel_size", "2",
                                     "--trainer.strategy.tensor_parallel_size", "1", "--run_dir", str(disk / "run"),
                                     f"--trainer.callbacks+={json.dumps(fill)}"], timeout_s=300)
    assert code == 5, err[-3000:]
    line = _one_error_line(err)
    ckpts = disk / "run/checkpoints"
    assert line.startswith(f"error: no space left on device while writing sharded checkpoint {ckpts}/"), line
    import re

    needed, free = (float(x) for x in re.search(r"\(needs ([0-9.]+) kB, ([0-9.]+) kB free\)", line).groups())
    assert needed > free  # the last good folder's size, and the space left after the temporary folder went
    assert f"the last good checkpoint is {ckpts / 'last.ckpt'}; free space, then resume with: ppo-lightning fit" in line
    assert sorted(p.name for p in ckpts.iterdir()) == ["iteration-00001.ckpt", "last.ckpt"]  # no .tmp folder
    check_checkpoint_file(ckpts / "last.ckpt")
    assert last_good_checkpoint(ckpts) == ckpts / "last.ckpt"
    assert torch.load(ckpts / "last.ckpt/meta.pt", weights_only=True)["RolloutDataModule"]["iteration"] == 1


def test_a_busy_local_store_delays_metrics_and_loses_none(tmp_path, capfd):
    """SQLAlchemy's pool exhausted (a 16-member group's runs writing one SQLite file on a loaded machine):
    the sender waits and retries, as for a server that is away; every iteration reaches the store."""
    import mlflow
    from mlflow.exceptions import MlflowException

    from ppo_lightning.training.mlflow_sender import MlflowSender

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(tracking_uri=uri)
    run = client.create_run(client.create_experiment("busy"))
    log_batch, refusals = client.log_batch, [2]

    def busy(run_id, metrics=(), **kw):
        if refusals[0] > 0:
            refusals[0] -= 1
            raise MlflowException("QueuePool limit of size 5 overflow 10 reached, connection timed out, timeout 30.00")
        return log_batch(run_id, metrics=metrics, **kw)

    client.log_batch = busy
    sender = MlflowSender(client, uri, run.info.run_id, tmp_path / "spool.jsonl", local=True)
    for i in range(1, 6):
        sender.submit({"kind": "metrics", "step": i, "timestamp": 1000 + i, "metrics": {"frames": float(i)}})
    assert sender.flush(60)
    sender.stop()
    assert refusals == [0] and "not logged" not in capfd.readouterr().err
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "frames")) == [1, 2, 3, 4, 5]
