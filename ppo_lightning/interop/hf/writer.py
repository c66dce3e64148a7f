"""Writing Hugging Face folders: ``ppo-lightning export-hf CKPT OUT_DIR``.

An exported folder holds

- ``config.json``: ``model_type`` ``ppo_lightning_actor_critic``, the network hyperparameters
  (``network``, defaults filled in: a recurrent network's ``core`` and ``core_size`` among them, and
  ``state_size``, the numbers of its state per env), ``observation_space``, ``action_space``, ``torch_dtype``, the
  algorithm's hyperparameters, the environment (the data module's hyperparameters), training frames
  and iterations, the last training episodes' mean return, the measured evaluation, and
  ``auto_map`` for transformers;
- ``model.safetensors`` (or ``model-0000N-of-0000M.safetensors`` + ``model.safetensors.index.json``
  above ``max_shard_size``), written by ``huggingface_hub.save_torch_state_dict``: the actor-critic's
  weights only (the ``network.`` entries of the checkpoint's state dict, prefix stripped). The
  proximal (EWMA) copy, optimizer state and reward/advantage normalizer statistics stay out;
- ``configuration_ppo_lightning.py`` / ``modeling_ppo_lightning.py`` (templates in
  ``ppo_lightning/interop/hf/remote/``) and ``networks_ppo_lightning.py``, generated from the training code
  by `ppo_lightning.interop.hf.bundle`: ``AutoModel.from_pretrained(folder, trust_remote_code=True)`` needs
  only torch, transformers and safetensors;
- ``README.md``, a ``huggingface_hub.ModelCard`` with the measured mean return as ``model-index``
  metadata (``evaluate`` episodes, default 10; 0 skips), and ``replay.mp4``, the agent playing.

Every bad input raises `ExportError` with a one-line message, before anything is written; the
folder is written beside ``out_dir`` under a temporary name, then renamed.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from ppo_lightning.core.configs import plain
from ppo_lightning.core.safety import check_code, code_references
from ppo_lightning.core.errors import StorageFull, UnwritablePath
from ppo_lightning.core.storage import (check_writable, free_bytes, fsync_tree, out_of_space, replace_folder,
                                        space_error_text)
from ppo_lightning.interop.checkpoint_io import DATA_STATE_KEY, ExportError, load_network
from ppo_lightning.interop.hf.bundle import BundleError, network_source
from ppo_lightning.interop.hf.card import model_card
from ppo_lightning.interop.hf.loader import DTYPES, MODEL_TYPE, parse_dtype
from ppo_lightning.nets.recurrent import ENCODER_SETTINGS

FORMAT_VERSION = 2  # 2: self-contained network code (networks_ppo_lightning.py)
REMOTE_DIR = Path(__file__).parent / "remote"
TEMPLATE_FILES = ("configuration_ppo_lightning.py", "modeling_ppo_lightning.py")
NETWORK_FILE = "networks_ppo_lightning.py"
REPLAY_FILE = "replay.mp4"
AUTO_MAP = {
    "AutoConfig": "configuration_ppo_lightning.PPOLightningConfig",
    "AutoModel": "modeling_ppo_lightning.PPOLightningActorCritic",
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(I?)B?\s*$", re.IGNORECASE)


def parse_size(size: int | str) -> int:
    """Bytes of a size like ``2GB``, ``500MB``, ``10KB`` (powers of 1000; ``GiB``: of 1024) or an int."""
    if isinstance(size, bool):
        raise ExportError(f"invalid max_shard_size {size!r}")
    if isinstance(size, int):
        if size <= 0:
            raise ExportError(f"max_shard_size must be a positive number of bytes or a size like '2GB', got {size!r}")
        return size
    found = _SIZE.match(str(size))
    if not found or float(found.group(1)) <= 0:
        raise ExportError(f"invalid max_shard_size {size!r} (a size like 2GB, 500MB or a number of bytes)")
    base = 1024 if found.group(3) else 1000
    return int(float(found.group(1)) * base ** " KMGT".index(found.group(2).upper() or " "))


def _resolved_network(net: torch.nn.Module, network_cfg: dict[str, Any]) -> dict[str, Any]:
    """``network_cfg`` with the network class's defaults filled in (informative, JSON-safe; the
    result builds the same network). A recurrent network (`ppo_lightning.nets.recurrent`): its
    encoder's settings' defaults too; its ``encoder`` argument stays out (``build_network`` passes
    ``name`` as the encoder)."""
    out = dict(network_cfg)
    out.setdefault("name", "mlp")
    skip = {"self", "observation_space", "action_space"}
    if getattr(net, "recurrent", False):
        skip.add("encoder")
        for name, default in ENCODER_SETTINGS.get(getattr(net, "encoder_name", None), {}).items():
            out.setdefault(name, default)
    try:
        params = inspect.signature(type(net).__init__).parameters
    except (TypeError, ValueError):
        return plain(out, json_safe=True)
    for name, p in params.items():
        if name in skip or name in out:
            continue
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.default is inspect.Parameter.empty:
            continue
        if p.default is None or isinstance(p.default, (bool, int, float, str, tuple, list)):
            out[name] = p.default
    return plain(out, json_safe=True)


def _rank_episodes(data_state: dict | None) -> list[dict]:
    """Each data-parallel rank's episode record (``returns``, ``lengths``, ``count``) in the data
    module's checkpoint state: under ``per_rank`` (every rank's own state); at the top level for one
    seed of a vectorized group (`ppo_lightning.interop.checkpoint_io.select_seed` puts it there) and
    in checkpoints written before the states were gathered per rank."""
    if not data_state:
        return []
    if isinstance(data_state.get("episodes"), dict):
        return [data_state["episodes"]]
    states = data_state.get("per_rank")
    states = states if isinstance(states, list) else [data_state]
    return [s["episodes"] for s in states if isinstance(s, dict) and isinstance(s.get("episodes"), dict)]


def _episode_count(data_state: dict | None) -> int | None:
    episodes = _rank_episodes(data_state)
    return sum(int(e.get("count", 0)) for e in episodes) if episodes else None


def _mean_return(data_state: dict | None, last: int = 20) -> float | None:
    """The run's last ``episode/return_mean20``: each rank's last ``last`` episodes, pooled
    (`ppo_lightning.data.parallel.pool_episode_metrics`); None without a finished episode."""
    returns = [float(r) for e in _rank_episodes(data_state) for r in list(e.get("returns") or [])[-last:]]
    return sum(returns) / len(returns) if returns else None


def build_config(checkpoint: dict[str, Any], net: torch.nn.Module, dtype: str) -> dict[str, Any]:
    hparams = dict(checkpoint["hyper_parameters"])
    data_state = checkpoint.get(DATA_STATE_KEY)
    data_state = data_state if isinstance(data_state, dict) else None
    algorithm = {k: v for k, v in hparams.items() if k not in ("observation_space", "action_space", "network", "init_from")}
    frames = data_state.get("frames") if data_state else None
    recurrent = {"state_size": int(net.state_size)} if getattr(net, "recurrent", False) else {}  # informative
    try:
        from importlib.metadata import version

        pkg_version = version("ppo-lightning")
    except Exception:
        pkg_version = None
    return plain(
        {
            "model_type": MODEL_TYPE,
            "architectures": ["PPOLightningActorCritic"],
            "auto_map": AUTO_MAP,
            "format_version": FORMAT_VERSION,
            "network": _resolved_network(net, hparams.get("network") or {"name": "mlp"}),
            **recurrent,
            "observation_space": hparams["observation_space"],
            "action_space": hparams["action_space"],
            "torch_dtype": dtype,
            "algorithm": algorithm,
            "environment": checkpoint.get("datamodule_hyper_parameters"),
            "training": {
                "frames": None if frames is None else int(frames),
                "iterations": data_state.get("iteration") if data_state else None,
                "global_step": checkpoint.get("global_step"),
                "episodes": _episode_count(data_state),
                "final_train_return_mean20": _mean_return(data_state),
            },
            "training_frames": None if frames is None else int(frames),
            "ppo_lightning_version": pkg_version,
        },
        json_safe=True,
    )


def _check_out_dir(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ExportError(f"output path exists and is not a folder: {out}")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ExportError(f"output folder {out} exists and is not empty (pass --overwrite to replace it)")


def export_hf(
    ckpt: str | os.PathLike,
    out_dir: str | os.PathLike,
    max_shard_size: int | str = "2GB",
    dtype: str = "float32",
    overwrite: bool = False,
    evaluate: int = 10,
    video: bool = True,
    seed: int = 0,
    seed_index: int | None = None,
    trust_code: bool = False,
) -> Path:
    """Export a checkpoint (``.ckpt`` file or sharded folder) to a Hugging Face folder; returns it.

    ``evaluate``: episodes to play with the exported weights for the model card (0: none);
    ``video``: with ``evaluate``, also write ``replay.mp4`` (env 0's first episode).
    ``seed_index``: seed k of a vectorized seed group's checkpoint. ``trust_code``: the evaluation may
    import the module of a ``module:EnvId`` env id the checkpoint names (else it is skipped, in one line).
    """
    from huggingface_hub import save_torch_state_dict

    out = Path(out_dir)
    dtype_name, torch_dtype = parse_dtype(dtype)
    shard_bytes = parse_size(max_shard_size)
    if not isinstance(evaluate, int) or isinstance(evaluate, bool) or evaluate < 0:
        raise ExportError(f"evaluate must be a number of episodes >= 0, got {evaluate!r}")
    _check_out_dir(out, overwrite)
    check_writable(out.parent, "export folder", "choose another OUT_DIR")  # before any work: exit code 4

    net, checkpoint = load_network(ckpt, seed_index)
    weights = {
        k: (v.to(torch_dtype) if v.is_floating_point() else v).contiguous() for k, v in net.state_dict().items()
    }
    config = build_config(checkpoint, net, dtype_name)
    config["dtype"] = dtype_name  # transformers >= 5 name of torch_dtype
    num_params = sum(p.numel() for p in net.parameters())
    try:
        source = network_source()
    except BundleError as err:
        raise ExportError(f"cannot write self-contained network code: {err}") from None

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        evaluation = None
        if evaluate:
            # the stored weights (rounded to dtype), run in float32
            net.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in weights.items()})
            evaluation = _evaluate(net, config, evaluate, seed, tmp / REPLAY_FILE if video else None, trust_code)
            if evaluation is not None:
                config["evaluation"] = plain({k: v for k, v in evaluation.items() if k not in ("video",)}, json_safe=True)
        save_torch_state_dict(weights, tmp, max_shard_size=shard_bytes, metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        for name in TEMPLATE_FILES:
            shutil.copyfile(REMOTE_DIR / name, tmp / name)
        (tmp / NETWORK_FILE).write_text(source)
        replay = REPLAY_FILE if (tmp / REPLAY_FILE).is_file() else None
        model_card(config, num_params, evaluation, replay).save(tmp / "README.md")
        fsync_tree(tmp)
        replace_folder(tmp, out)
    except BaseException as err:
        # a full disk: what the folder needed = the weights, the code, the config, and the replay and
        # model card as far as they were written
        needed = sum(v.numel() * v.element_size() for v in weights.values()) + len(source.encode()) + sum(
            (REMOTE_DIR / name).stat().st_size for name in TEMPLATE_FILES) + len(json.dumps(config, indent=2)) + sum(
            p.stat().st_size for p in tmp.rglob("*") if p.is_file() and p.suffix in (".mp4", ".md")) \
            if isinstance(err, Exception) and out_of_space(err) else None
        shutil.rmtree(tmp, ignore_errors=True)
        if needed is not None:
            raise StorageFull("Hugging Face folder", out, needed, free_bytes(out.parent), space_error_text(err)) from None
        raise
    return out


def _evaluate(net: torch.nn.Module, config: dict[str, Any], episodes: int, seed: int, video: Path | None,
              trust_code: bool = False) -> dict | None:
    """`evaluate_policy` on the training env (Procgen: held-out levels); None, with a message, if the
    env cannot be built or played here (the folder is still written, its card says "not measured")."""
    # start-up cost: the evaluation pulls the envs and TorchRL (seconds), needed only with --evaluate
    from ppo_lightning.interop.evaluation import evaluate_policy, resolve_env

    try:
        env = config.get("environment") or {}
        check_code(code_references({"env_id": env.get("env_id")}, "environment"), "the checkpoint", trust_code)
        env_id, kwargs = resolve_env(env, None, "test")
        return evaluate_policy(net, env_id, episodes=episodes, env_kwargs=kwargs, seed=seed,
                               video=None if video is None else str(video))
    except Exception as err:  # noqa: BLE001 - the export itself is still valid: say so, write no score
        text = str(err).strip().splitlines()
        print(f"[ppo-lightning] export-hf: no evaluation in the model card ({type(err).__name__}: "
              f"{text[0] if text else ''})", file=sys.stderr, flush=True)
        if video is not None and video.exists():
            video.unlink()
        return None


def export_main(argv: list[str] | None = None) -> int:
    """``ppo-lightning export-hf CKPT OUT_DIR [--max-shard-size 2GB] [--dtype ...] [--overwrite]``."""
    parser = argparse.ArgumentParser(
        prog="ppo-lightning export-hf",
        description="Export a ppo_lightning checkpoint (.ckpt file or sharded folder) to a Hugging Face folder.",
    )
    parser.add_argument("ckpt", help="a .ckpt file or an FSDP-sharded checkpoint folder")
    parser.add_argument("out_dir", help="the folder to write (must not exist or be empty, unless --overwrite)")
    parser.add_argument("--max-shard-size", default="2GB", help="largest safetensors file, e.g. 2GB, 500MB (default 2GB)")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES), help="weights dtype (default float32)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing non-empty OUT_DIR")
    parser.add_argument("--evaluate", type=int, default=10, metavar="N",
                        help="play N episodes for the model card's mean return and replay.mp4 (default 10; 0 skips)")
    parser.add_argument("--no-video", action="store_true", help="do not write replay.mp4")
    parser.add_argument("--seed", type=int, default=0, help="env seed of the evaluation (default 0)")
    parser.add_argument("--trust-code", action="store_true",
                        help="let the evaluation import the module of a module:EnvId env id the checkpoint names")
    parser.add_argument("--seed_index", "--seed-index", type=int, default=None, metavar="K",
                        help="a vectorized seed group's checkpoint: export its seed K")
    args = parser.parse_args(argv)
    size: int | str = int(args.max_shard_size) if str(args.max_shard_size).isdigit() else args.max_shard_size
    try:
        out = export_hf(args.ckpt, args.out_dir, max_shard_size=size, dtype=args.dtype, overwrite=args.overwrite,
                        evaluate=args.evaluate, video=not args.no_video, seed=args.seed, seed_index=args.seed_index,
                        trust_code=args.trust_code)
    except ExportError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (UnwritablePath, StorageFull) as err:  # exit codes 4 and 5, as for fit
        print(f"error: {err}" + (f"; {args.ckpt} is unchanged" if isinstance(err, StorageFull) else ""), file=sys.stderr)
        return err.exit_code
    print(f"exported {args.ckpt} to {out}")
    evaluation = json.loads((out / "config.json").read_text()).get("evaluation")
    if evaluation:
        print(f"  mean return {evaluation['mean_return']:.2f} +/- {evaluation['std_return']:.2f} over "
              f"{evaluation['episodes']} episodes (in README.md as model-index)")
    return 0
