"""The model card (``README.md``) of an exported folder, built with ``huggingface_hub.ModelCard``.

A measured evaluation goes into the card's Hub metadata as ``model-index`` (``EvalResult``:
task ``reinforcement-learning``, dataset = the env id, metric ``mean_reward`` = ``"mean +/- std"``,
as Stable-Baselines3 / RL Zoo cards do), so the Hub shows it; the text repeats it.
"""

from __future__ import annotations

import json
from typing import Any

RECURRENT_HEADING = "## Recurrent state"


def recurrent_usage(config: dict[str, Any]) -> str:
    """The card's section on a recurrent network's state (empty for a feed-forward network): what the
    state is, how it starts and resets, and a runnable episode loop (its ``python`` block is tested)."""
    network = config.get("network") or {}
    core = network.get("core")
    if not core:
        return ""
    size = config.get("state_size", "D")
    return f"""
{RECURRENT_HEADING}

The network has {'an' if core == 'lstm' else 'a'} {str(core).upper()} core (`core: {core}`, `core_size` {network.get('core_size')}): it remembers the episode so far in a
state of {size} numbers per env (`model.state_size`), which every call takes and returns.

- `model(observation, state, is_init)` returns `(*distribution_parameters, value, new_state)`;
  `model.act(observation, deterministic, state=state, is_init=is_init)` returns `(action, new_state)`
  (`policy`, `value` and `distribution` likewise return their output and the new state).
- `state` `[batch, {size}]`: zeros (`model.initial_state(batch)`) before an episode's first step,
  then the `new_state` the previous step returned. `state=None` starts every episode of the batch.
- `is_init` `[batch]` bool: True for the envs whose episode starts at this step (after a reset);
  their state is zeroed before the step, as in training. `is_init=None` (with a state): no episode
  starts.

One episode of a gymnasium env of the training environment (`env`), the state carried step to step:

```python
import torch
from transformers import AutoModel

model = AutoModel.from_pretrained("path/to/this/folder", trust_remote_code=True)


def play(env, seed=None, deterministic=True):
    obs, _ = env.reset(seed=seed)
    state = model.initial_state(1)                 # zeros: the state before the episode's first step
    is_init = torch.ones(1, dtype=torch.bool)      # the first step: the state is reset (zeroed) there
    total, done = 0.0, False
    while not done:
        action, state = model.act(torch.as_tensor(obs).unsqueeze(0), deterministic, state=state, is_init=is_init)
        obs, reward, terminated, truncated, _ = env.step(action[0].numpy())
        total, done = total + float(reward), terminated or truncated
        is_init = torch.zeros(1, dtype=torch.bool)  # the episode goes on: carry the state
    return total
```

With several envs at once, keep one state row per env and set `is_init` True for the envs that have
just been reset: the state is per env, never shared. With ppo_lightning, `load_pretrained` gives the
network, whose `step(observation, state, is_init)` returns the same tuple as `model(...)`;
`evaluate_policy` and `ppo-lightning evaluate` carry the state themselves.
"""


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
    recurrent = recurrent_usage(config)
    state_note = f"\nThis network is recurrent: its calls also take and return its state ({RECURRENT_HEADING[3:]}, below).\n" \
        if recurrent else ""
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
{state_note}
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
{recurrent}
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
