"""Wall time of a run whose MLflow tracking server goes away for a minute, against the same run
with the server up throughout (issue 38).

A real ``mlflow server`` (SQLite backend) on 127.0.0.1; the same CartPole PPO-EWMA fit (``ppo-lightning
fit`` as a subprocess, the shipped config ``cartpole/ppo_ewma``, the return threshold removed so that both
runs do the same work) is run:

1. with the server up throughout;
2. with the server SIGKILLed ``--kill_after`` seconds after it received the fit's first metrics, and started again
   ``--outage_s`` seconds later (it is reachable again once its start-up finishes; the time it was
   unreachable is printed).

    python benchmarks/tracking_outage.py [--frames 40960] [--kill_after 10] [--outage_s 60]

Prints each run's wall time, the frames steps the server holds for it, and the outage run's
"unreachable" / "is back" lines, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


def start_server(db: Path, port: int, log: Path) -> subprocess.Popen:
    return subprocess.Popen([str(Path(sys.executable).with_name("mlflow")), "server", "--backend-store-uri",
                             f"sqlite:///{db}", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
                             "--default-artifact-root", str(db.parent / "artifacts")],
                            stdout=open(log, "a"), stderr=subprocess.STDOUT, start_new_session=True)


def wait_healthy(url: str, timeout_s: float = 300) -> float:
    t0 = time.monotonic()
    while not healthy(url):
        if time.monotonic() - t0 > timeout_s:
            raise SystemExit(f"mlflow server not up after {timeout_s} s")
        time.sleep(0.2)
    return time.monotonic()


def kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=60)


def fit(uri: str, experiment: str, frames: int, run_dir: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "PYTHONWARNINGS": "ignore"}
    return subprocess.Popen([sys.executable, "-m", "ppo_lightning.cli.main", "fit", "--config",
                             str(ROOT / "ppo_lightning/configs/cartpole/ppo_ewma.yaml"), "--trainer.callbacks=[]",
                             "--trainer.enable_progress_bar", "false", "--video_every", "null",
                             "--data.total_frames", str(frames), "--run_dir", str(run_dir),
                             "--mlflow.tracking_uri", uri, "--mlflow.experiment", experiment],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=40_960, help="frames per fit (default 40960)")
    parser.add_argument("--kill_after", type=float, default=10.0,
                        help="seconds after the server has the fit's first metrics that it is killed")
    parser.add_argument("--outage_s", type=float, default=60.0, help="seconds before the server is started again")
    args = parser.parse_args()

    import mlflow

    work = Path(tempfile.mkdtemp(prefix="tracking-outage-"))
    port = free_port()
    uri, health = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port}/health"
    db, log = work / "server.db", work / "server.log"
    server = start_server(db, port, log)
    wait_healthy(health)
    results = {}
    try:
        for name in ("server up", "60 s outage"):
            experiment = name.replace(" ", "-")
            t0 = time.monotonic()
            proc = fit(uri, experiment, args.frames, work / experiment)
            down = None
            if name != "server up":  # the kill: --kill_after s after the server has the run's first metrics
                client = mlflow.MlflowClient(tracking_uri=uri)
                while proc.poll() is None:
                    found = client.get_experiment_by_name(experiment)
                    runs = client.search_runs([found.experiment_id]) if found is not None else []
                    if runs and client.get_metric_history(runs[0].info.run_id, "frames"):
                        break
                    time.sleep(0.5)
                time.sleep(args.kill_after)
                kill(server)
                t_kill = time.monotonic()
                time.sleep(args.outage_s)
                server = start_server(db, port, log)
                down = wait_healthy(health) - t_kill
            out, err = proc.communicate()
            wall = time.monotonic() - t0
            if proc.returncode != 0:
                raise SystemExit(f"{name}: fit failed ({proc.returncode}): {err[-2000:]}")
            client = mlflow.MlflowClient(tracking_uri=uri)
            runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
            steps = [m.step for m in client.get_metric_history(runs[0].info.run_id, "frames")]
            lines = [line for line in err.splitlines() if "MLflow tracking server" in line]
            results[name] = {"wall_s": round(wall, 1), "unreachable_s": None if down is None else round(down, 1),
                             "frames_steps": len(steps), "last_step": max(steps, default=0),
                             "status": runs[0].info.status, "lines": lines}
            print(f"{name}: {wall:.1f} s wall" + (f" (server unreachable for {down:.1f} s)" if down else "")
                  + f"; the server holds {len(steps)} frames steps up to {max(steps, default=0)}, status "
                  f"{runs[0].info.status}", flush=True)
            for line in lines:
                print(f"  {line}")
    finally:
        kill(server)
    up, out = results["server up"]["wall_s"], results["60 s outage"]["wall_s"]
    print(f"outage / up: {out / up:.3f}")
    print(json.dumps({"frames": args.frames, "kill_after_s": args.kill_after, "outage_s": args.outage_s,
                      "results": {k: {kk: vv for kk, vv in v.items() if kk != "lines"} for k, v in results.items()}}))


if __name__ == "__main__":
    main()
