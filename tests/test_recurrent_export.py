"""Issue 64, item 5: a recurrent policy outside training. ``evaluate`` (and its videos) and the held-out
evaluation carry the state per env, zeroed where an episode starts; ``export-hf`` writes a folder whose
``AutoModel`` takes and returns the state and reproduces the network's ``step`` over episodes, where
ppo_lightning cannot be imported.

The networks are built directly (no training): their policy heads are scaled up so that the state
changes the actions, which lets an evaluation that forgot to reset (or to carry) the state fail."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import pytest
import torch

import spaces_envs  # noqa: F401  (registers DictObsMultiDiscreteAct-v0)
from test_evaluate import ISOLATED_PREAMBLE

from ppo_lightning.envs import env_spaces, make_env
from ppo_lightning.interop.evaluation import HeldOutEvaluation, evaluate_policy
from ppo_lightning.interop.export import export_hf
from ppo_lightning.nets.models import build_network, make_distribution

CARTPOLE = "CartPole-v1"
COMPOSITE = "DictObsMultiDiscreteAct-v0"  # Dict observation, MultiDiscrete action, episodes of 8 steps


def recurrent_network(env_id: str, core: str, arch: str = "dual", seed: int = 0):
    """(network, its config, observation space, action space): an untrained recurrent actor-critic whose
    actions depend on its state (policy head x 300)."""
    obs_space, act_space = env_spaces(env_id)
    cfg = {"name": "mlp", "hidden_sizes": [16], "core": core, "core_size": 8, "arch": arch}
    torch.manual_seed(seed)
    net = build_network(obs_space, act_space, cfg)
    with torch.no_grad():
        net.policy_head.weight.mul_(300)
    return net.eval(), cfg, obs_space, act_space


def write_checkpoint(path: Path, nets: list, cfg: dict, obs_space: dict, act_space: dict, env_id: str) -> Path:
    """A Lightning-style checkpoint of one run (one network) or of a vectorized group (its members'
    weights stacked under ``network.inner.``, as `ppo_lightning.nets.seed_stack.SeedStack` saves them)."""
    if len(nets) == 1:
        state = {f"network.{k}": v.clone() for k, v in nets[0].state_dict().items()}
    else:
        state = {f"network.inner.{k}": torch.stack([n.state_dict()[k] for n in nets]) for k in nets[0].state_dict()}
    hparams = {"observation_space": obs_space, "action_space": act_space, "network": cfg,
               "seeds": list(range(len(nets)))}
    torch.save({"state_dict": state, "hyper_parameters": hparams,
                "datamodule_hyper_parameters": {"env_id": env_id, "num_envs": 2}}, path)
    return path


def oracle_episodes(net, env_id: str, num_envs: int, steps: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """``steps`` steps of ``num_envs`` envs with ``net.step``: the observations, ``is_init`` (True at the
    first step and after every ``done``) and the network's outputs at each step, the state carried
    from step to step by this loop (greedy actions)."""
    env = make_env(env_id, num_envs, seed)
    act_space = net.action_space
    td = env.reset()
    state, is_init = net.initial_state(num_envs), torch.ones(num_envs, dtype=torch.bool)
    record: dict[str, list] = {"obs": [], "is_init": [], "params": [], "value": [], "state": []}
    with torch.no_grad():
        for _ in range(steps):
            obs = td.get("observation")
            *params, value, state = net.step(obs, state, is_init)
            for key, v in (("obs", obs), ("is_init", is_init), ("params", torch.cat(params, -1)),
                           ("value", value), ("state", state)):
                record[key].append(v.clone())
            td.set("action", make_distribution(act_space, *params).mode)
            out, td = env.step_and_maybe_reset(td)
            is_init = out.get(("next", "done")).reshape(-1).clone()
    env.close()
    return {k: torch.stack(v) for k, v in record.items()}


def card_example(readme: str) -> str:
    """The python block of the model card's recurrent-state section."""
    section = readme.split("## Recurrent state", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def play_oracle(net, env_id: str, seed: int) -> float:
    """One greedy episode of a gymnasium env with ``net.step``, from a zero state (the card's loop)."""
    env = gym.make(env_id)
    obs, _ = env.reset(seed=seed)
    state, is_init, total, done = net.initial_state(1), torch.ones(1, dtype=torch.bool), 0.0, False
    with torch.no_grad():
        while not done:
            logits, _, state = net.step(torch.as_tensor(obs)[None], state, is_init)
            obs, reward, terminated, truncated, _ = env.step(int(logits.argmax(-1)))
            total, done, is_init = total + float(reward), terminated or truncated, torch.zeros(1, dtype=torch.bool)
    return total


# Runs where ppo_lightning, lightning, torchrl and tensordict cannot be imported (as test_evaluate's
# AutoModel test): the folder needs torch and transformers only.
_ISOLATED = ISOLATED_PREAMBLE + textwrap.dedent(
    """

    cases = json.loads(sys.argv[1])
    report = {}
    for name, case in cases.items():
        model = AutoModel.from_pretrained(case["folder"], trust_remote_code=True)
        assert model.recurrent and model.state_size == case["state_size"], (model.recurrent, model.state_size)
        ep = torch.load(case["episodes"])
        state, first = None, True
        worst = 0.0
        torch.set_grad_enabled(False)  # inference, as the oracle steps (oneDNN's LSTM rounds otherwise with autograd)
        for t in range(ep["obs"].shape[0]):
            # the first step with state=None (zeros), then the model's own state, reset where is_init
            out = model(ep["obs"][t], state, None if first else ep["is_init"][t])
            *params, value, state = out
            first = False
            for got, want in ((torch.cat(params, -1), ep["params"][t]), (value, ep["value"][t]), (state, ep["state"][t])):
                if not torch.equal(got, want):
                    worst = max(worst, (got - want).abs().max().item())
        actions, _ = model.act(ep["obs"][0], True, state=model.initial_state(ep["obs"].shape[1]),
                               is_init=ep["is_init"][0])
        report[name] = {"worst": worst, "steps": int(ep["obs"].shape[0]), "actions": actions.tolist()}
        if "card" in case:
            import gymnasium
            scope = {}
            exec(case["card"].replace("path/to/this/folder", case["folder"]), scope)
            report[name]["card_returns"] = [scope["play"](gymnasium.make(case["env_id"]), seed=s) for s in (5, 6)]
    report["blocked_modules_loaded"] = sorted(k for k in sys.modules if k.split(".")[0] in BLOCKED)
    print(json.dumps(report))
    """
)


def test_recurrent_export_loads_with_automodel_without_the_package_and_reproduces_the_policy(tmp_path):
    """An LSTM policy (one run) and a GRU policy with a Dict observation and MultiDiscrete actions
    (member 1 of a group of 2) exported; AutoModel, where ppo_lightning cannot be imported, gives the
    network's step outputs bitwise at every step of episodes with ends inside (state carried, reset
    where is_init), and the card's episode loop runs and plays as the network does."""
    lstm, lstm_cfg, obs_space, act_space = recurrent_network(CARTPOLE, "lstm", seed=1)
    ckpt = write_checkpoint(tmp_path / "lstm.ckpt", [lstm], lstm_cfg, obs_space, act_space, CARTPOLE)
    lstm_folder = export_hf(ckpt, tmp_path / "hf_lstm", evaluate=3, video=False)

    members = [recurrent_network(COMPOSITE, "gru", arch="shared", seed=s)[0] for s in (1, 2)]
    _, gru_cfg, cobs, cact = recurrent_network(COMPOSITE, "gru", arch="shared", seed=1)
    group_ckpt = write_checkpoint(tmp_path / "group.ckpt", members, gru_cfg, cobs, cact, COMPOSITE)
    gru_folder = export_hf(group_ckpt, tmp_path / "hf_gru", evaluate=0, seed_index=1)

    config = json.loads((lstm_folder / "config.json").read_text())
    assert (config["network"]["core"], config["network"]["core_size"], config["state_size"]) == ("lstm", 8, 32)
    # the card's evaluation is evaluate_policy over the exported weights (the state carried)
    assert config["evaluation"]["returns"] == evaluate_policy(lstm, CARTPOLE, episodes=3, seed=0)["returns"]
    readme = (lstm_folder / "README.md").read_text()
    assert "## Recurrent state" in readme and "initial_state" in readme and "is_init" in readme
    assert json.loads((gru_folder / "config.json").read_text())["state_size"] == 8

    cases = {}
    for name, net, env_id, folder in (("lstm", lstm, CARTPOLE, lstm_folder), ("gru", members[1], COMPOSITE, gru_folder)):
        episodes = oracle_episodes(net, env_id, num_envs=3, steps=40)
        assert episodes["is_init"][1:].any(), "no episode ended: the reset is not exercised"
        torch.save(episodes, tmp_path / f"{name}.pt")
        cases[name] = {"folder": str(folder), "episodes": str(tmp_path / f"{name}.pt"), "state_size": net.state_size}
    cases["lstm"].update(card=card_example(readme), env_id=CARTPOLE)

    script = tmp_path / "isolated.py"
    script.write_text(_ISOLATED)
    env = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, str(script), json.dumps(cases)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["blocked_modules_loaded"] == []
    for name in ("lstm", "gru"):
        assert report[name]["worst"] == 0.0 and report[name]["steps"] == 40, (name, report[name])
    assert report["lstm"]["card_returns"] == [play_oracle(lstm, CARTPOLE, 5), play_oracle(lstm, CARTPOLE, 6)]
    first = torch.load(tmp_path / "gru.pt")["params"][0]  # act(deterministic) at the first step: the step's mode
    assert report["gru"]["actions"] == make_distribution(cact, first).mode.tolist()


def _returns_per_env(net, env_id: str, num_envs: int, episodes: int, seed: int, reset: bool) -> list[float]:
    """Greedy returns of ``episodes`` episodes over ``num_envs`` gymnasium envs seeded as
    `ppo_lightning.envs.make_env` seeds them (env i: a reset with seed ``seed + i``, then unseeded
    resets; the first episode played follows the second reset), each played alone by ``net.step``;
    ``reset``: the state starts at zeros in every episode (else only in the first)."""
    out = []
    for i in range(num_envs):
        env = gym.make(env_id)
        env.reset(seed=seed + i)
        state = net.initial_state(1)
        for e in range((episodes + i) // num_envs):
            obs, _ = env.reset()
            total, done, is_init = 0.0, False, torch.tensor([reset or e == 0])
            with torch.no_grad():
                while not done:
                    logits, _, state = net.step(torch.as_tensor(obs)[None], state, is_init)
                    obs, reward, terminated, truncated, _ = env.step(int(logits.argmax(-1)))
                    total, done, is_init = total + float(reward), terminated or truncated, torch.zeros(1, dtype=torch.bool)
            out.append(total)
    return sorted(out)


@pytest.mark.parametrize("core, seed", [("lstm", 1), ("gru", 2)])  # weights whose episodes last 8 to 60 steps
def test_evaluate_resets_the_state_where_an_episode_ends(core, seed, tmp_path):
    """evaluate_policy's greedy returns are those of each env played alone from a zero state at every
    episode start (an oracle on gymnasium itself); the oracle that carries the state across episodes
    differs, so a missing reset would fail. The checkpoint, its exported folder and AutoModel give the
    same figures."""
    from transformers import AutoModel

    from ppo_lightning.cli.evaluate import evaluate_source

    net, cfg, obs_space, act_space = recurrent_network(CARTPOLE, core, seed=seed)
    result = evaluate_policy(net, CARTPOLE, episodes=6, num_envs=2, seed=3, deterministic=True)
    oracle = _returns_per_env(net, CARTPOLE, 2, 6, seed=3, reset=True)
    assert sorted(result["returns"]) == oracle
    assert _returns_per_env(net, CARTPOLE, 2, 6, seed=3, reset=False) != oracle  # the test can fail

    ckpt = write_checkpoint(tmp_path / "run.ckpt", [net], cfg, obs_space, act_space, CARTPOLE)
    folder = export_hf(ckpt, tmp_path / "hf", evaluate=0)
    sampled = evaluate_policy(net, CARTPOLE, episodes=4, num_envs=2, seed=1)
    for source in (ckpt, folder):
        got = evaluate_source(source, episodes=6, num_envs=2, seed=3, deterministic=True)
        assert got["returns"] == result["returns"], source
        assert evaluate_source(source, episodes=4, num_envs=2, seed=1)["returns"] == sampled["returns"], source
    model = AutoModel.from_pretrained(folder, trust_remote_code=True)
    assert evaluate_policy(model, CARTPOLE, episodes=6, num_envs=2, seed=3, deterministic=True)["returns"] == \
        result["returns"]


def test_evaluate_a_member_of_a_recurrent_group_and_record_its_video(tmp_path):
    """``evaluate --seed_index k`` of a group's checkpoint plays member k as the network alone; the
    video of a recurrent policy has a frame per step of its episode."""
    from ppo_lightning.cli.main import main
    from ppo_lightning.interop.video import read_mp4

    members = [recurrent_network(CARTPOLE, "lstm", seed=s) for s in (2, 1)]
    _, cfg, obs_space, act_space = members[0]
    ckpt = write_checkpoint(tmp_path / "group.ckpt", [m[0] for m in members], cfg, obs_space, act_space, CARTPOLE)
    figures = tmp_path / "score.json"
    assert main(["evaluate", str(ckpt), "--seed_index", "1", "--episodes", "4", "--deterministic",
                 "--json", str(figures), "--video", str(tmp_path / "member1.mp4")]) == 0
    alone = evaluate_policy(members[1][0], CARTPOLE, episodes=4, deterministic=True)
    assert json.loads(figures.read_text())["returns"] == alone["returns"]
    result = evaluate_policy(members[1][0], CARTPOLE, episodes=1, num_envs=1, video=str(tmp_path / "one.mp4"))
    assert read_mp4(tmp_path / "one.mp4").shape[0] == result["lengths"][0] == result["video_frames"]


def test_held_out_evaluation_carries_the_state_between_evaluations_and_resumes():
    """The held-out evaluation's envs persist between evaluations, and so does a recurrent policy's state:
    two evaluations of 40 steps report the episodes of one of 80 steps. The state is in the callback's
    checkpoint state: a callback restored from it after the first evaluation reports the second."""
    net, *_ = recurrent_network(CARTPOLE, "gru", seed=2)
    action_space = net.action_space

    def evaluation(steps: int) -> HeldOutEvaluation:
        ev = HeldOutEvaluation(num_envs=3, num_steps=steps, train_levels=False, deterministic=True)
        ev.envs["test"] = make_env(CARTPOLE, 3, 7)
        return ev

    split, whole, resumed = evaluation(40), evaluation(80), evaluation(40)
    try:
        first = split.run_split("test", net, action_space)
        saved = split.state_dict()
        second = split.run_split("test", net, action_space)
        both = whole.run_split("test", net, action_space)
        resumed.load_state_dict(saved)
        again = resumed.run_split("test", net, action_space)
    finally:
        for ev in (split, whole, resumed):
            ev.teardown(None, None, "fit")
    assert first["episodes"] + second["episodes"] == both["episodes"] >= 3
    total = first["return_mean"] * first["episodes"] + second["return_mean"] * second["episodes"]
    assert total == pytest.approx(both["return_mean"] * both["episodes"])
    state = saved["states"]["test"]
    assert state["state"].shape == (3, net.state_size) and state["is_init"].dtype == torch.bool
    assert again == second


def test_feed_forward_exported_model_takes_no_state(tmp_path):
    """A feed-forward folder is unchanged: no state in config.json or the card, and a state is refused."""
    from transformers import AutoModel

    obs_space, act_space = env_spaces(CARTPOLE)
    torch.manual_seed(0)
    net = build_network(obs_space, act_space, {"name": "mlp", "hidden_sizes": [8]})
    ckpt = write_checkpoint(tmp_path / "ff.ckpt", [net], {"name": "mlp", "hidden_sizes": [8]}, obs_space, act_space,
                            CARTPOLE)
    folder = export_hf(ckpt, tmp_path / "hf", evaluate=0)
    assert "state_size" not in json.loads((folder / "config.json").read_text())
    assert "Recurrent state" not in (folder / "README.md").read_text()
    model = AutoModel.from_pretrained(folder, trust_remote_code=True)
    assert not model.recurrent and model.state_size == 0
    with pytest.raises(ValueError, match="feed-forward"):
        model(torch.zeros(2, 4), torch.zeros(2, 4))


def test_a_trained_group_member_exports_evaluates_and_plays_its_replay(tmp_path):
    """A real group of two GRU members trained one iteration: ``export-hf --seed_index 1`` writes member
    1's weights (`seed_state_dict`), its card's evaluation is evaluate_policy of member 1 alone with the
    state carried, the replay has a frame per step of an episode, and AutoModel steps as the member's network does. The
    group module itself (a training video) plays member 0 as alone."""
    from test_members_every_env import run
    from transformers import AutoModel

    from ppo_lightning import load_pretrained
    from ppo_lightning.cli.main import main
    from ppo_lightning.interop.checkpoint_io import load_network
    from ppo_lightning.interop.video import read_mp4

    network = {"name": "mlp", "hidden_sizes": [8], "core": "gru", "core_size": 6}
    group, dm, trainer = run(CARTPOLE, 0, 2, 1, network=network)
    ckpt = tmp_path / "group.ckpt"
    trainer.save_checkpoint(ckpt)
    folder = export_hf(ckpt, tmp_path / "hf", evaluate=2, seed_index=1)
    weights = group.network.seed_state_dict(1)
    net = load_pretrained(folder)
    assert all(torch.equal(net.state_dict()[k], weights[k]) for k in weights)
    config = json.loads((folder / "config.json").read_text())
    assert (config["network"]["core"], config["network"]["core_size"], config["state_size"]) == ("gru", 6, 12)
    assert config["evaluation"]["returns"] == evaluate_policy(net, CARTPOLE, episodes=2, seed=0)["returns"]
    assert read_mp4(folder / "replay.mp4").shape[0] in config["evaluation"]["lengths"]  # env 0's episode
    assert main(["evaluate", str(ckpt), "--seed_index", "1", "--episodes", "2", "--json", str(tmp_path / "s.json")]) == 0
    assert json.loads((tmp_path / "s.json").read_text())["returns"] == config["evaluation"]["returns"]
    # the group itself (its training video): member 0 plays, as alone
    member0, _ = load_network(ckpt, 0)
    assert evaluate_policy(group, CARTPOLE, episodes=3, seed=4)["returns"] == \
        evaluate_policy(member0, CARTPOLE, episodes=3, seed=4)["returns"]

    model = AutoModel.from_pretrained(folder, trust_remote_code=True)
    episodes = oracle_episodes(net, CARTPOLE, num_envs=2, steps=30)
    state = None
    for t in range(30):
        *params, value, state = model(episodes["obs"][t], state, None if t == 0 else episodes["is_init"][t])
        assert torch.equal(params[0], episodes["params"][t]) and torch.equal(value, episodes["value"][t])
