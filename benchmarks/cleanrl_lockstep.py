"""CleanRL's ``ppo_procgen.py`` in a subprocess, one iteration at a time (for ``throughput.py --cleanrl``).

The script is third-party (vwxyzjn/cleanrl, MIT) and not part of this repository; fetch it with

    curl -L -o ppo_procgen.py https://raw.githubusercontent.com/vwxyzjn/cleanrl/09f7a7f2f8038ebb532447815c728cf69eec7382/cleanrl/ppo_procgen.py

It needs ``tyro`` and ``tensorboard`` besides what this project installs (``procgen``, ``numpy<2``):
``pip install tyro tensorboard``; and gym's old step API (CleanRL pins ``gym==0.23.1``; this project's
``gym`` 0.26 changed ``reset``/``step``), which can live in a folder of its own that only the CleanRL
process sees: ``pip install --no-deps --target DIR gym==0.23.1`` and ``--cleanrl-pythonpath DIR``.

How it runs: a child process runs the unmodified script with ``runpy`` after three changes from
outside the script: torch's intra-op threads are set (``torch.set_num_threads``), and
``procgen.ProcgenEnv`` gets the benchmark's ``num_threads`` and ``distribution_mode`` (the script
hard-codes ``easy`` and Procgen's default of 4 worker threads). The script prints ``SPS: ..`` once at
the end of every iteration; at that print the child reports the CPU seconds (``time.process_time``:
all its threads) and wall seconds since it last resumed, then blocks until the parent says ``go``.
So the parent can interleave one CleanRL iteration after each of its own, and a CleanRL iteration is
timed alone (start-up and the first iteration are the warm-up). The script's other prints are dropped;
its TensorBoard files go to a temporary folder that is removed at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

def _child_env(threads: int, pythonpath: str | None) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.abspath(pythonpath), env.get("PYTHONPATH")) if p)
    return env


def requirements_error(pythonpath: str | None) -> str | None:
    """None if the CleanRL process can import what the script needs, else a one-line message."""
    probe = (
        "import importlib.util as u, sys\n"
        "missing = [m for m in ('tyro', 'tensorboard', 'gym', 'procgen') if u.find_spec(m) is None]\n"
        "if missing: print('missing', *missing); sys.exit()\n"
        "import importlib.metadata as md; print('gym', md.version('gym'))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env=_child_env(1, pythonpath)).stdout.split()
    if not out or out[0] == "missing":
        return (f"--cleanrl: the script needs {', '.join(out[1:]) or 'tyro, tensorboard, gym, procgen'}: "
                f"{sys.executable} -m pip install tyro tensorboard")
    major, minor = (int(x) for x in out[1].split(".")[:2])
    if (major, minor) >= (0, 26):
        return (f"--cleanrl: the script needs gym's old API (gym<0.26; it pins 0.23.1), this Python has gym {out[1]}: "
                f"{sys.executable} -m pip install --no-deps --target DIR gym==0.23.1 and pass --cleanrl-pythonpath DIR")
    return None


class CleanRLLockstep:
    """The parent's side: start the script (it runs start-up and its first iteration, the warm-up),
    then ``step()`` runs one more iteration and returns ``{"cpu_s", "wall_s"}`` of it."""

    def __init__(self, script: str, *, game: str, num_envs: int, num_steps: int, num_minibatches: int,
                 update_epochs: int, max_iterations: int, threads: int, procgen_threads: int,
                 distribution_mode: str = "hard", seed: int = 1, pythonpath: str | None = None) -> None:
        if not os.path.isfile(script):
            raise FileNotFoundError(f"--cleanrl: no such file {script!r}")
        self.frames_per_iteration = num_envs * num_steps
        self.rows: list[dict] = []
        self._dir = tempfile.mkdtemp(prefix="cleanrl_")
        self._stderr = open(os.path.join(self._dir, "stderr.txt"), "w+")
        script_args = [
            "--env-id", game, "--num-envs", str(num_envs), "--num-steps", str(num_steps),
            "--num-minibatches", str(num_minibatches), "--update-epochs", str(update_epochs),
            # enough iterations that the script never ends on its own before the parent stops it
            "--total-timesteps", str(self.frames_per_iteration * (max_iterations + 2)), "--seed", str(seed),
        ]
        env = _child_env(threads, pythonpath)
        self._proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), os.path.abspath(script), str(threads), str(procgen_threads),
             distribution_mode, *script_args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True, cwd=self._dir, env=env,
        )
        self.warmup = self._read()

    def _read(self) -> dict:
        line = self._proc.stdout.readline()
        if not line:
            self._proc.wait()
            self._stderr.seek(0)
            tail = self._stderr.read()[-2000:]
            self.close()
            raise RuntimeError(f"CleanRL's script exited with code {self._proc.returncode}:\n{tail}")
        return json.loads(line)

    def step(self) -> dict:
        self._proc.stdin.write("go\n")
        self._proc.stdin.flush()
        row = self._read()
        self.rows.append(row)
        return row

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                self._proc.stdin.write("stop\n")
                self._proc.stdin.flush()
            except BrokenPipeError:
                pass
            try:
                self._proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._stderr.close()
        shutil.rmtree(self._dir, ignore_errors=True)


def _child(script: str, threads: int, procgen_threads: int, distribution_mode: str, script_args: list[str]) -> None:
    import builtins
    import runpy
    import time

    import procgen
    import torch

    torch.set_num_threads(threads)
    make_env = procgen.ProcgenEnv

    def procgen_env(num_envs, env_name, **kwargs):
        kwargs["num_threads"] = procgen_threads
        kwargs["distribution_mode"] = distribution_mode
        return make_env(num_envs, env_name, **kwargs)

    procgen.ProcgenEnv = procgen_env  # the script does `from procgen import ProcgenEnv` when it runs
    control = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    since = [time.process_time(), time.perf_counter()]

    def report_and_wait(*args, **kwargs) -> None:
        if args and args[0] == "SPS:":  # the last line of every iteration
            cpu, wall = time.process_time(), time.perf_counter()
            control.write(json.dumps({"cpu_s": cpu - since[0], "wall_s": wall - since[1]}) + "\n")
            control.flush()
            if sys.stdin.readline().strip() != "go":
                os._exit(0)
            since[:] = [time.process_time(), time.perf_counter()]

    builtins.print = report_and_wait
    sys.argv = [script, *script_args]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    _child(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5:])
