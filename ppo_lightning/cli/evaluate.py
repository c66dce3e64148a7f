"""``ppo-lightning evaluate SOURCE``: score a trained agent, optionally record it.

SOURCE is a ``.ckpt`` file, an FSDP-sharded checkpoint folder or an exported Hugging Face folder.
The environment and its settings come from the training config stored in SOURCE (``--env``
overrides the id); for Procgen, ``--levels test`` (default) plays the full level distribution from
the first level past the training ones and ``--levels train`` the training levels.

    ppo-lightning evaluate runs/cartpole/<run>/checkpoints/last.ckpt --episodes 20 --deterministic
    ppo-lightning evaluate hf_cartpole --video cartpole.mp4 --json score.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from ppo_lightning.core.safety import check_code, code_references
from ppo_lightning.envs import env_spaces
from ppo_lightning.interop.checkpoint_io import ExportError, is_checkpoint, load_network
from ppo_lightning.interop.evaluation import evaluate_policy, format_result, resolve_env
from ppo_lightning.interop.hf.loader import is_pretrained_folder, load_pretrained, read_pretrained_config


def load_source(source: str | os.PathLike, seed_index: int | None = None) -> tuple[Any, dict[str, Any], dict, dict]:
    """(network, training environment settings, observation space, action space) of SOURCE."""
    path = Path(source)
    if not path.exists():
        raise ExportError(f"not found: {path}")
    if is_pretrained_folder(path):
        config = read_pretrained_config(path)
        net = load_pretrained(path)
        return net, dict(config.get("environment") or {}), config["observation_space"], config["action_space"]
    if is_checkpoint(path) or path.is_dir():
        net, checkpoint = load_network(path, seed_index)
        hparams = checkpoint["hyper_parameters"]
        env = checkpoint.get("datamodule_hyper_parameters")
        return net, dict(env or {}), hparams["observation_space"], hparams["action_space"]
    raise ExportError(f"{path} is neither a checkpoint nor an exported folder")


def check_observations(env_id: str, env_kwargs: dict, observation_space: dict) -> None:
    env_obs, _ = env_spaces(env_id, env_kwargs)
    if list(env_obs["shape"]) == list(observation_space["shape"]) and (
            env_obs.get("space") != observation_space.get("space") or
            env_obs.get("action_mask") != observation_space.get("action_mask")):
        raise ValueError(f"env {env_id} gives observations of space {env_obs.get('space')} (action mask: "
                         f"{env_obs.get('action_mask', 0)}), the network reads {observation_space.get('space')} "
                         f"(action mask: {observation_space.get('action_mask', 0)})")
    if list(env_obs["shape"]) != list(observation_space["shape"]):
        raise ValueError(
            f"env {env_id} gives observations of shape {list(env_obs['shape'])}, the network reads "
            f"{list(observation_space['shape'])}"
        )


def evaluate_source(source, episodes: int = 10, deterministic: bool = False, env_id: str | None = None,
                    levels: str = "test", seed: int = 0, num_envs: int | None = None, video: str | None = None,
                    video_episodes: int = 1, seed_index: int | None = None, trust_code: bool = False) -> dict[str, Any]:
    """`evaluate_policy` on the network of SOURCE (see the module doc). An env id SOURCE names that would
    import a module (``module:EnvId``) is refused unless ``trust_code`` (``--env`` is the user's own)."""
    if not isinstance(episodes, int) or episodes <= 0:
        raise ValueError(f"--episodes must be a positive integer, got {episodes!r}")
    net, training_env, obs_space, action_space = load_source(source, seed_index)
    if env_id is None:  # the env comes from the file: data, not code
        check_code(code_references({"env_id": training_env.get("env_id")}, "environment"), str(source), trust_code)
    target, kwargs = resolve_env(training_env, env_id, levels)
    check_observations(target, kwargs, obs_space)
    result = evaluate_policy(net, target, episodes=episodes, deterministic=deterministic, env_kwargs=kwargs,
                             seed=seed, num_envs=num_envs, video=video, video_episodes=video_episodes)
    result["source"] = str(source)
    if "num_levels" in kwargs:
        result["levels"] = levels
    return result


def evaluate_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="ppo-lightning evaluate",
        description="Score a trained agent: a .ckpt file, a sharded checkpoint folder or an exported Hugging Face folder.",
    )
    parser.add_argument("source", help="a .ckpt file, a sharded checkpoint folder or an export-hf folder")
    parser.add_argument("--episodes", type=int, default=10, help="complete episodes to play (default 10)")
    parser.add_argument("--deterministic", action="store_true", help="act with the mode instead of sampling")
    parser.add_argument("--env", default=None, help="environment id (default: the training env)")
    parser.add_argument("--levels", choices=("train", "test"), default="test",
                        help="Procgen: the training levels or held-out ones (default test)")
    parser.add_argument("--seed", type=int, default=0, help="env seed (default 0)")
    parser.add_argument("--num-envs", type=int, default=None, help="envs run at once (default min(episodes, 16))")
    parser.add_argument("--video", default=None, metavar="OUT.mp4", help="record env 0's first episode(s) to this MP4")
    parser.add_argument("--video-episodes", type=int, default=1, help="episodes in the video (default 1)")
    parser.add_argument("--trust-code", action="store_true",
                        help="allow a module:EnvId env id stored in SOURCE to be imported (only for sources you trust)")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the figures as one JSON object")
    parser.add_argument("--seed_index", "--seed-index", type=int, default=None, metavar="K",
                        help="a vectorized seed group's checkpoint: evaluate its seed K")
    args = parser.parse_args(argv)
    try:
        result = evaluate_source(args.source, episodes=args.episodes, deterministic=args.deterministic,
                                 env_id=args.env, levels=args.levels, seed=args.seed, num_envs=args.num_envs,
                                 video=args.video, video_episodes=args.video_episodes, seed_index=args.seed_index,
                                 trust_code=args.trust_code)
    except (ExportError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(format_result(result))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        print(f"  figures: {args.json}")
    return 0
