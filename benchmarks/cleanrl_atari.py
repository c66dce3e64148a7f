"""CleanRL's ``ppo_atari.py``, unmodified, in this process, with stand-ins set from outside the script.

    python benchmarks/cleanrl_atari.py ppo_atari.py --threads 1 --record out.jsonl -- --env-id BreakoutNoFrameskip-v4 ...

The script is third-party (vwxyzjn/cleanrl, MIT) and not part of this repository; fetch ``cleanrl/ppo_atari.py``
and ``cleanrl_utils/atari_wrappers.py`` (its Atari wrappers, as ``DIR/cleanrl_utils/``) from the public
repository. It was written for gymnasium 0.29 and imports ``tyro`` and TensorBoard; gymnasium's resize wrapper
needs OpenCV. Put gymnasium 0.29.1, ``cleanrl_utils`` and OpenCV in a folder of their own on ``PYTHONPATH`` for
this process only (``pip install --no-deps --target DIR gymnasium==0.29.1 opencv-python-headless==4.10.0.84``).

From outside the script: ``tyro.cli`` is a stand-in that reads ``--name value`` pairs after ``--`` into the
script's ``Args`` (dashes for underscores, typed by the field's default); ``SummaryWriter`` is a stand-in that
appends each ``charts/episodic_return`` (a whole game's unclipped score, by ``RecordEpisodeStatistics``) with
its ``global_step`` to ``--record`` as ``{"frames", "return"}`` and each ``charts/SPS`` as ``{"sps", "frames",
"cpu_s", "wall_s"}``; torch's intra-op threads are set to ``--threads``; ale-py's ``NoFrameskip-v4`` ids are
registered with the gymnasium the script imports (MinAtar's gymnasium plugin, which that gymnasium would fail
to load, is left out). Nothing else changes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import runpy
import sys
import time
import types


def _tyro_stand_in(argv: list[str]) -> types.ModuleType:
    def cli(cls):
        values = {}
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for name, raw in zip(argv[0::2], argv[1::2]):
            key = name.lstrip("-").replace("-", "_")
            if key not in fields:
                raise SystemExit(f"cleanrl_atari: the script's Args has no {name}")
            default = fields[key].default
            if isinstance(default, bool):
                values[key] = raw.lower() in ("1", "true", "yes")
            elif isinstance(default, (int, float)) and not isinstance(default, bool):
                values[key] = type(default)(float(raw)) if isinstance(default, int) else float(raw)
            else:
                values[key] = raw
        return cls(**values)

    module = types.ModuleType("tyro")
    module.cli = cli
    return module


def _tensorboard_stand_in(record: str) -> types.ModuleType:
    t0_wall, t0_cpu = time.time(), time.process_time()

    class SummaryWriter:
        def __init__(self, *args, **kwargs) -> None:
            self.file = open(record, "a")

        def add_text(self, *args, **kwargs) -> None:
            pass

        def add_scalar(self, tag, value, step=None, *args, **kwargs) -> None:
            if tag == "charts/episodic_return":
                row = {"frames": int(step), "return": float(value)}
            elif tag == "charts/SPS":
                row = {"sps": float(value), "frames": int(step), "cpu_s": time.process_time() - t0_cpu,
                       "wall_s": time.time() - t0_wall}
            else:
                return
            self.file.write(json.dumps(row) + "\n")
            self.file.flush()

        def close(self) -> None:
            self.file.close()

    module = types.ModuleType("torch.utils.tensorboard")
    module.SummaryWriter = SummaryWriter
    return module


def _without_minatar_plugin() -> None:
    """gymnasium 0.29 loads every ``gymnasium.envs`` entry point when imported; MinAtar's (installed by this
    project) points at ``minatar.gym``, which the MinAtar release here does not ship: left out."""
    import importlib.metadata as md

    entry_points = md.entry_points

    def without(**kwargs):
        found = entry_points(**kwargs)
        if kwargs.get("group") == "gymnasium.envs":
            return md.EntryPoints(e for e in found if not e.value.startswith("minatar."))
        return found

    md.entry_points = without


def main() -> None:
    argv = sys.argv[1:]
    script_args = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("script")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--record", required=True)
    a = parser.parse_args(own)
    import torch

    torch.set_num_threads(a.threads)
    sys.modules["tyro"] = _tyro_stand_in(script_args)
    sys.modules["torch.utils.tensorboard"] = _tensorboard_stand_in(a.record)
    _without_minatar_plugin()
    import ale_py.registration
    import gymnasium

    if "BreakoutNoFrameskip-v4" not in gymnasium.registry:
        ale_py.registration.register_v0_v4_envs()
    sys.argv = [a.script, *script_args]
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    namespace = runpy.run_path(a.script, run_name="__main__")
    with open(a.record, "a") as f:
        f.write(json.dumps({"done": int(namespace.get("global_step", 0)), "cpu_s": time.process_time()}) + "\n")


if __name__ == "__main__":
    main()
