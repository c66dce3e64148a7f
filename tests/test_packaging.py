"""The YAML configs travel with the package: ``--config`` takes a shipped name, and a wheel installed
outside the repository trains one."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from ppo_lightning.core.configs import configs_dir, resolve_config, resolve_config_args, shipped_configs

ROOT = Path(__file__).resolve().parents[1]


def test_shipped_names_resolve_and_bad_ones_fail_in_one_line(tmp_path):
    names = shipped_configs()
    assert {"cartpole/ppo_ewma", "minatar/ppo", "procgen/ppo_hard", "mujoco/ppo_hopper"} <= set(names)
    assert resolve_config("cartpole/ppo_ewma") == configs_dir() / "cartpole/ppo_ewma.yaml"
    assert resolve_config("cartpole/ppo_ewma.yaml") == resolve_config("cartpole/ppo_ewma")
    assert resolve_config("experiments/cartpole/ppo_ewma.yaml") == resolve_config("cartpole/ppo_ewma")  # old path
    mine = tmp_path / "cartpole" / "ppo_ewma.yaml"  # a file of that path wins over the shipped name
    mine.parent.mkdir()
    mine.write_text("seed_everything: 3\n")
    assert resolve_config(str(mine)) == mine
    with pytest.raises(ValueError, match=r"^--config cartpole/nope: no such file and no shipped config.*ppo-lightning configs"):
        resolve_config("cartpole/nope")
    assert resolve_config_args(["fit", "--config", "minatar/ppo", "-c", "minatar/ppg", "--config=cartpole/ppo",
                                "--model.lr", "1"]) == [
        "fit", "--config", str(configs_dir() / "minatar/ppo.yaml"), "-c", str(configs_dir() / "minatar/ppg.yaml"),
        f"--config={configs_dir() / 'cartpole/ppo.yaml'}", "--model.lr", "1"]


def test_unknown_config_name_is_a_one_line_error(tmp_path, capsys):
    from ppo_lightning.cli.fit import main

    assert main(["fit", "--config", "cartpole/ppo_typo", "--run_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --config cartpole/ppo_typo: no such file and no shipped config of that name "
                   "(`ppo-lightning configs` lists them)"]


def test_wheel_installed_outside_the_repository_trains_a_shipped_config(tmp_path):
    """`pip wheel .`, installed into a fresh virtual environment (its dependencies from this one's
    site-packages, the package itself only from the wheel), run from a folder outside the repository."""
    wheels = tmp_path / "wheels"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(ROOT),
                            "-w", str(wheels)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = wheels.glob("ppo_lightning-*.whl")
    packed = zipfile.ZipFile(wheel).namelist()
    assert {f"ppo_lightning/configs/{name}.yaml" for name in shipped_configs()} <= set(packed)

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}  # nothing of the repository
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
                              "-q", str(wheel)], capture_output=True, text=True, timeout=300, env=env)
    assert install.returncode == 0, install.stderr[-3000:]
    # then the dependencies (torch, lightning, ...) from this environment, after the venv's own site-packages
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    work = tmp_path / "elsewhere"
    work.mkdir()
    where = subprocess.run([str(python), "-c", "import ppo_lightning; print(ppo_lightning.__file__)"], cwd=work,
                           capture_output=True, text=True, env=env, check=True).stdout.strip()
    assert Path(where).is_relative_to(venv), where  # the wheel's copy, not the repository's
    listed = subprocess.run([str(venv / "bin" / "ppo-lightning"), "configs"], cwd=work, capture_output=True, text=True,
                            env=env, timeout=120)
    assert listed.returncode == 0 and "cartpole/ppo_ewma" in listed.stdout.split(), listed.stderr[-2000:]
    fit = subprocess.run([str(venv / "bin" / "ppo-lightning"), "fit", "--config", "cartpole/ppo_ewma",
                          "--data.total_frames", "512", "--mlflow.enabled", "false", "--trainer.enable_progress_bar",
                          "false", "--video_every", "null"], cwd=work, capture_output=True, text=True, env=env, timeout=300)
    assert fit.returncode == 0, fit.stderr[-3000:]
    assert "finished: 512 frames, 2 iterations" in fit.stdout
    assert (work / "runs").is_dir() and not (ROOT / "runs" / "cartpole" / work.name).exists()
