"""The model card (``README.md``) of an exported folder, built with ``huggingface_hub.ModelCard``.

A measured evaluation goes into the card's Hub metadata as ``model-index`` (``EvalResult``:
task ``reinforcement-learning``, dataset = the env id, metric ``mean_reward`` = ``"mean +/- std"``,
as Stable-Baselines3 / RL Zoo cards do), so the Hub shows it; the text repeats it.
"""

from __future__ import annotations

import json
from typing import Any


def algorithm_name(algo: dict[str, Any]) -> str:
    if algo.get("decoupled") and algo.get("proximal_com") is not None:
        return f"PPO-EWMA (decoupled PPO, proximal policy an EWMA of the weights, center of mass {algo['proximal_com']})"
    if algo.get("decoupled"):
        return "decoupled PPO"
    return "PPO"


def model_card(config: dict[str, Any], num_params: int, evaluation: dict[str, Any] | None, video: str | None):
    """A ``huggingface_hub.ModelCard`` for an exported folder."""
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    algo = config.get("algorithm") or {}
    env = config.get("environment") or {}
    training = config.get("training") or {}
    env_id = env.get("env_id", "unknown")
    name = algorithm_name(algo)
    short = "PPO-EWMA" if "EWMA" in name else ("decoupled-PPO" if algo.get("decoupled") else "PPO")
    eval_results = None
    if evaluation is not None:
        eval_results = [
            EvalResult(
                task_type="reinforcement-learning",
                task_name="reinforcement-learning",
                dataset_type=env_id,
                dataset_name=env_id,
                metric_type="mean_reward",
                metric_name="mean_reward",
                metric_value=f"{evaluation['mean_return']:.2f} +/- {evaluation['std_return']:.2f}",
            )
        ]
    data = ModelCardData(
        library_name="ppo_lightning",
        tags=["reinforcement-learning", "ppo", "ppo-lightning", env_id],
        model_name=f"{short} {env_id}",
        eval_results=eval_results,
    )

    def fmt(v: Any) -> str:
        return "unknown" if v is None else (f"{v:.2f}" if isinstance(v, float) else str(v))

    if evaluation is not None:
        how = "deterministic" if evaluation.get("deterministic") else "sampled"
        score = (
            f"- Evaluation: mean return **{evaluation['mean_return']:.2f} +/- {evaluation['std_return']:.2f}** "
            f"(std) over {evaluation['episodes']} episodes ({how} actions, seed {evaluation['seed']}; min "
            f"{evaluation['min_return']:.2f}, max {evaluation['max_return']:.2f}, mean length {evaluation['mean_length']:.1f}), "
            f"measured by `ppo-lightning export-hf` with `ppo_lightning.evaluate_policy`."
        )
        if "normalized_return_mean" in evaluation:
            score += f" Normalized return {evaluation['normalized_return_mean']:.3f}."
    else:
        score = "- Evaluation: not measured (exported with `--evaluate 0`, or its env could not be played there)."
    replay = f"\n![replay]({video})\n\n`{video}`: the agent playing (`ppo-lightning evaluate --video`).\n" if video else ""
    rows = "\n".join(f"| `{k}` | `{json.dumps(v)}` |" for k, v in algo.items())
    env_rows = "\n".join(f"| `{k}` | `{json.dumps(v)}` |" for k, v in env.items())
    body = f"""
# {short} on {env_id}, trained with ppo_lightning

{score}
- Algorithm: {name}, `{algo.get('objective', 'clip')}` objective.
- Network: `{json.dumps(config['network'])}`, {num_params:,} parameters, stored as `{config['torch_dtype']}`.
- Observation space: `{json.dumps(config['observation_space'])}`; action space: `{json.dumps(config['action_space'])}`.
- Training frames: {fmt(training.get('frames'))}; iterations: {fmt(training.get('iterations'))}; gradient steps: {fmt(training.get('global_step'))}.
- Training return (mean of the last 20 training episodes, sampled actions): {fmt(training.get('final_train_return_mean20'))}.
{replay}
## Usage

With transformers only (`pip install torch transformers safetensors`; the network code is in this
folder, pure torch):

```python
from transformers import AutoModel
model = AutoModel.from_pretrained("path/to/this/folder", trust_remote_code=True)
action = model.act(observation)                # model.distribution(obs), model.value(obs), model(obs)
```

With ppo_lightning (no transformers, no pickle):

```python
from ppo_lightning import load_pretrained, evaluate_policy
net = load_pretrained("path/to/this/folder")   # the plain actor-critic nn.Module
print(evaluate_policy(net, "{env_id}", episodes=10))
```

```bash
ppo-lightning evaluate path/to/this/folder --episodes 10 --video replay.mp4
```

To continue training from these weights: `model.init_from: path/to/this/folder` in a training config.

The weights are the policy-and-value network (with its observation normalizer, if it has one):
the proximal (EWMA) copy, optimizer state and reward/advantage normalizer statistics of the
checkpoint are not included.

## Algorithm hyperparameters

| name | value |
|---|---|
{rows}

## Environment and rollout configuration

| name | value |
|---|---|
{env_rows}
"""
    return ModelCard(f"---\n{data.to_yaml()}\n---\n{body}")
