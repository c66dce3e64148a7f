"""Issue 62: every gymnasium space (observations and actions), action masks, and one line for what is
missing. Each test on a small env of its own (`spaces_envs`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import distributions as D

import spaces_envs  # noqa: F401  (registers the envs)
from test_members_every_env import assert_member_is_alone, run

from ppo_lightning.nets.composite import MASKED_LOGIT, CompositeDistribution, composite_kl

ROOT = Path(__file__).resolve().parents[1]

# every leaf kind, nested: Dict(a: Discrete(3), b: Tuple(MultiDiscrete([2, 4]), MultiBinary(3)), c: Box(2))
SPACE = {"type": "dict", "parts": [
    ["a", {"type": "discrete", "n": 3}],
    ["b", {"type": "tuple", "parts": [{"type": "multi_discrete", "nvec": [2, 4]}, {"type": "multi_binary", "n": 3}]}],
    ["c", {"type": "box", "shape": [2], "dtype": "float32"}],
]}
# parameters: 3 logits | 2 + 4 logits | 3 logits | 2 locs, 2 scales = 16; actions: 1 | 2 | 3 | 2 = 8


def _random_params(batch: int, gen: torch.Generator) -> torch.Tensor:
    p = torch.randn(batch, 16, generator=gen, dtype=torch.float64)
    p[:, 14:] = p[:, 14:].exp()  # scales > 0
    return p


def _oracle_parts(p: torch.Tensor) -> list[tuple[D.Distribution, slice]]:
    """torch.distributions per part, with the action columns each reads."""
    return [
        (D.Categorical(logits=p[:, 0:3]), slice(0, 1)),
        (D.Categorical(logits=p[:, 3:5]), slice(1, 2)),
        (D.Categorical(logits=p[:, 5:9]), slice(2, 3)),
        (D.Independent(D.Bernoulli(logits=p[:, 9:12]), 1), slice(3, 6)),
        (D.Independent(D.Normal(p[:, 12:14], p[:, 14:16]), 1), slice(6, 8)),
    ]


def _oracle_log_prob(p, action):
    total = 0
    for dist, cols in _oracle_parts(p):
        a = action[:, cols]
        total = total + dist.log_prob(a[:, 0].long() if isinstance(dist, D.Categorical) else a)
    return total


def test_composite_log_prob_entropy_kl_are_sums_of_torch_distributions():
    gen = torch.Generator().manual_seed(0)
    p, q = _random_params(64, gen), _random_params(64, gen)
    dist = CompositeDistribution(p, SPACE)
    action = dist.sample(generator=gen).double()
    assert action.shape == (64, 8)
    torch.testing.assert_close(dist.log_prob(action), _oracle_log_prob(p, action))
    torch.testing.assert_close(dist.entropy(), sum(d.entropy() for d, _ in _oracle_parts(p)))
    oracle_kl = sum(D.kl_divergence(a, b) for (a, _), (b, _) in zip(_oracle_parts(q), _oracle_parts(p)))
    torch.testing.assert_close(composite_kl(SPACE, q, p), oracle_kl)
    # the mode: each categorical's argmax, the bits of positive logits, the means
    mode = dist.mode
    assert mode[:, 0].tolist() == p[:, 0:3].argmax(-1).tolist()
    assert mode[:, 3:6].tolist() == (p[:, 9:12] > 0).float().tolist()
    torch.testing.assert_close(mode[:, 6:8].double(), p[:, 12:14], atol=1e-6, rtol=0)


def test_composite_samples_follow_each_part():
    """Many draws: each categorical's frequencies and each bit's rate match its probabilities."""
    p = _random_params(1, torch.Generator().manual_seed(1)).float().expand(20000, 16)
    draws = CompositeDistribution(p, SPACE).sample(generator=torch.Generator().manual_seed(2))
    freq = torch.bincount(draws[:, 2].long(), minlength=4).double() / len(draws)
    torch.testing.assert_close(freq, torch.softmax(p[0, 5:9].double(), -1), atol=0.015, rtol=0)
    torch.testing.assert_close(draws[:, 3:6].double().mean(0), torch.sigmoid(p[0, 9:12].double()), atol=0.015, rtol=0)


def test_masked_logits_never_sample_an_illegal_action_and_entropy_is_over_the_legal_ones():
    from ppo_lightning.nets.composite import mask_logits

    space = {"type": "multi_discrete", "nvec": [3, 4]}
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(256, 7, generator=gen)
    mask = torch.rand(256, 7, generator=gen) < 0.5
    mask[:, 0] = mask[:, 3] = True  # one legal choice per part at least
    dist = CompositeDistribution(mask_logits(logits, mask), space)
    draws = torch.stack([dist.sample(generator=gen) for _ in range(50)])  # [50, 256, 2]
    assert mask[:, :3].gather(1, draws[..., 0].long().T).all() and mask[:, 3:].gather(1, draws[..., 1].long().T).all()
    legal_entropy = []
    for row, m in zip(logits, mask):
        legal_entropy.append(D.Categorical(logits=row[:3][m[:3]]).entropy() + D.Categorical(logits=row[3:][m[3:]]).entropy())
    torch.testing.assert_close(dist.entropy(), torch.stack(legal_entropy))
    assert MASKED_LOGIT < -1e8


# ------------------------------------------------------------------------------------------------ training
KINDS = ["DiscreteObs-v0", "MultiDiscreteObs-v0", "MultiBinary-v0", "DictObsMultiDiscreteAct-v0", "TupleAct-v0",
         "DictAct-v0", "InfoMask-v0", "DictMask-v0", "StartDiscrete-v0"]


@pytest.mark.parametrize("env_id", KINDS)
def test_every_space_kind_trains_alone_and_member_k_is_seed_k(env_id):
    """Two iterations alone and as a group of 2: member k is seed k alone (the masked envs raise on an
    illegal action, so every sampled action was legal)."""
    assert assert_member_is_alone(env_id, 2) < 1e-5


def test_box_observations_of_a_composite_action_env_normalize():
    """A Box observation stays as it is with a composite action, so the network's observation
    normalization applies (each member with its own statistics)."""
    net = {"name": "mlp", "hidden_sizes": [16, 16], "activation": "tanh", "normalize_observation": True}
    assert assert_member_is_alone("TupleAct-v0", 2, network=net) < 1e-5


def test_lockstep_collection_of_a_masked_composite_env():
    """The members' envs stepped through TorchRL's env (not `VectorGames`): member k is still seed k."""
    assert assert_member_is_alone("DictMask-v0", 2, data_kwargs={"batched_rollout": False},
                                  collector="LockstepRollout") < 1e-5


def test_every_entry_point_of_the_network_masks_the_same_logits():
    """policy (collection, proximal), forward (the loss's current policy) and forward_aux (PPG) give the
    illegal choices `MASKED_LOGIT`; the behavior logits are the policy's as collected."""
    from ppo_lightning.envs import env_spaces
    from ppo_lightning.nets.models import build_network

    obs_space, act_space = env_spaces("DictMask-v0")
    net = build_network(obs_space, act_space, {"name": "mlp", "hidden_sizes": [8], "aux_value_head": True,
                                               "arch": "detach"})
    obs = torch.rand(6, obs_space["shape"][0])
    obs[:, -5:] = torch.tensor([[1, 0, 0, 1, 1], [0, 1, 1, 1, 0]] * 3, dtype=torch.float32)
    illegal = obs[:, -5:] < 0.5
    for params in (net.policy(obs)[0], net(obs)[0], net.forward_aux(obs)[0]):
        assert (params[illegal] == MASKED_LOGIT).all() and (params[~illegal] > MASKED_LOGIT / 2).all()


@pytest.mark.parametrize("settings", [
    {"objective": "kl"}, {"objective": "adaptive_kl"}, {"decoupled": True, "proximal_com": 4.0},
    {"decoupled": True, "proximal_com": 4.0, "objective": "kl", "kl_form": "analytic"},
    {"ppg": {"n_pi": 2, "n_aux_epochs": 1, "aux_mbsize": 4}},
], ids=["kl", "adaptive_kl", "ppo_ewma", "ewma_kl", "ppg"])
def test_composite_masked_actions_under_every_objective(settings):
    """A Dict observation with a mask and MultiDiscrete actions, under the KL objectives, PPO-EWMA and PPG:
    member k is seed k alone."""
    assert assert_member_is_alone("DictMask-v0", 2, **settings) < 1e-5
    assert assert_member_is_alone("TupleAct-v0", 2, **settings) < 1e-5


def test_composite_env_resumes_bitwise(tmp_path):
    from test_robust import fit_and_resume

    for env_id in ("DictMask-v0", "FrozenLake-v1"):
        (_, ref), (_, got) = fit_and_resume(tmp_path / env_id, env_id, iterations=3)
        assert all(torch.equal(ref[k], got[k]) for k in ref), env_id


# ------------------------------------------------------------------------------------- evaluate and export
def _no_package_python(script: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run ``script`` where ``import ppo_lightning`` fails (an exported folder needs torch and transformers only)."""
    guard = textwrap.dedent("""
        import sys
        class _NoPackage:
            def find_spec(self, name, path=None, target=None):
                if name == "ppo_lightning" or name.startswith("ppo_lightning."):
                    raise ImportError("ppo_lightning is not installed here")
        sys.meta_path.insert(0, _NoPackage())
        sys.path = [p for p in sys.path if p not in ("", ".", ROOT)]
    """).replace("ROOT", repr(str(ROOT)))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-c", guard + textwrap.dedent(script)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def _train_and_save(env_id: str, tmp_path: Path) -> Path:
    model, dm, trainer = run(env_id, 0, 1, 2)
    ckpt = tmp_path / "last.ckpt"
    trainer.save_checkpoint(ckpt)
    return ckpt


def test_an_info_mask_policy_evaluates_legally():
    """Taxi's convention (``info["action_mask"]``), sampled and greedy, on an env that raises on an illegal action."""
    from ppo_lightning.interop.evaluation import evaluate_policy

    model, _, _ = run("InfoMask-v0", 0, 1, 1)
    for deterministic in (False, True):
        result = evaluate_policy(model.network, "InfoMask-v0", episodes=4, deterministic=deterministic)
        assert len(result["returns"]) == 4


@pytest.mark.parametrize("env_id", ["DictObsMultiDiscreteAct-v0", "DictMask-v0"])
def test_composite_policies_evaluate_and_export_to_automodel(env_id, tmp_path):
    """Trained, evaluated (sampled and greedy: the masked envs raise on an illegal action) and exported;
    the exported folder loads with AutoModel where ppo_lightning cannot be imported, its outputs the
    network's, its sampled actions legal."""
    from ppo_lightning import load_pretrained
    from ppo_lightning.envs import make_env
    from ppo_lightning.nets.models import make_policy_operator
    from ppo_lightning.cli.evaluate import evaluate_source
    from ppo_lightning.interop.export import export_hf

    ckpt = _train_and_save(env_id, tmp_path)
    for deterministic in (False, True):
        result = evaluate_source(ckpt, episodes=3, deterministic=deterministic, env_id=env_id)
        assert len(result["returns"]) == 3
    folder = export_hf(ckpt, tmp_path / "hf")
    config = json.loads((folder / "config.json").read_text())
    assert config["observation_space"]["space"]["type"] in ("dict", "discrete")
    net = load_pretrained(folder)
    env = make_env(env_id, 4, 3)
    policy = make_policy_operator(net, config["action_space"])
    with torch.no_grad():
        obs = env.rollout(5, policy, break_when_any_done=False).get("observation").flatten(0, 1)
    torch.save(obs, tmp_path / "obs.pt")
    with torch.no_grad():
        expected = [t.float() for t in net(obs)]
    torch.save(expected, tmp_path / "expected.pt")
    mask = config["observation_space"].get("action_mask", 0)
    out = _no_package_python(f"""
        import torch
        from transformers import AutoModel
        model = AutoModel.from_pretrained({str(folder)!r}, trust_remote_code=True)
        obs = torch.load("obs.pt")
        got = [t.float() for t in model(obs)]
        for e, g in zip(torch.load("expected.pt"), got):
            torch.testing.assert_close(g, e, rtol=0, atol=0)
        torch.manual_seed(0)
        actions = torch.stack([model.act(obs) for _ in range(20)])
        if {mask}:
            legal = obs[:, -{mask}:] > 0.5
            nvec = {config["action_space"].get("space", {}).get("nvec", [config["action_space"].get("n", 0)])}
            start, ok = 0, True
            for i, n in enumerate(nvec):
                a = (actions if actions.dim() == 2 else actions[..., i]).long()
                ok &= bool(legal[:, start:start + n].gather(1, a.T).all())
                start += n
            assert ok, "an illegal action was sampled"
        print("OK", type(model.network).__name__, tuple(actions.shape))
    """, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "OK SpacesActorCritic" in out.stdout


# ------------------------------------------------------------------------------------ what is missing
def _cli(args: list[str], capsys) -> tuple[int, str, str]:
    """``ppo-lightning ARGS`` in process: (exit code, stdout, stderr)."""
    from ppo_lightning.cli.main import main

    capsys.readouterr()
    code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_missing_dependency_is_one_line_naming_the_extra(tmp_path, monkeypatch, capsys):
    """An env whose module raises gymnasium's DependencyNotInstalled (as LunarLander without Box2D does):
    one line naming the extra, exit 2, no traceback."""
    (tmp_path / "needs_box2d_env.py").write_text(
        "from gymnasium.error import DependencyNotInstalled\n"
        "raise DependencyNotInstalled('Box2D is not installed, you can install it by run `pip install swig` "
        "followed by `pip install \"gymnasium[box2d]\"`')\n")
    (tmp_path / "register_box2d_env.py").write_text(
        "import gymnasium as gym\n"
        "gym.register('NeedsBox2D-v0', entry_point='needs_box2d_env:Env')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    code, _, err = _cli(["fit", "--config", "cartpole/ppo", "--data.env_id", "register_box2d_env:NeedsBox2D-v0"], capsys)
    assert code == 2, err[-2000:]
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == ("error: data.env_id: NeedsBox2D-v0 cannot be made (Box2D is not installed): "
                                            "pip install 'ppo-lightning[box2d]'")
    try:
        import Box2D  # noqa: F401
    except ImportError:  # and the real one, where Box2D is missing
        from ppo_lightning.envs import env_spaces

        with pytest.raises(ValueError, match=r"^data.env_id: LunarLander-v3 cannot be made \(Box2D is not installed\): "
                                             r"pip install 'ppo-lightning\[box2d\]'$"):
            env_spaces("LunarLander-v3")


def test_unsupported_space_names_what_is_supported_and_the_wrapper():
    from ppo_lightning.envs import env_spaces

    with pytest.raises(ValueError) as err:
        env_spaces("TextObs-v0")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("data.env_id: TextObs-v0: the observation space is a Text space, which cannot be used")
    assert "supported are Box, Discrete, MultiDiscrete, MultiBinary, and Dict / Tuple" in message
    assert "gymnasium.ObservationWrapper" in message


def test_frozenlake_trains_from_the_cartpole_config(tmp_path, monkeypatch, capsys):
    """FrozenLake-v1 (a Discrete observation) with ``--config cartpole/ppo``: trains and evaluates."""
    monkeypatch.chdir(tmp_path)
    code, _, err = _cli(["fit", "--config", "cartpole/ppo", "--data.env_id", "FrozenLake-v1", "--data.total_frames", "512",
                         "--run_dir", "run", "--mlflow.enabled", "false", "--video_every", "null"], capsys)
    assert code == 0, err[-3000:]
    code, out, err = _cli(["evaluate", "run/checkpoints/last.ckpt", "--episodes", "2"], capsys)
    assert code == 0, err[-3000:]
    assert "FrozenLake-v1: 2 episodes" in out


def test_logit_l2_ignores_the_masked_logits():
    """The ``logit_l2`` auxiliary term reads a masked policy's legal logits (illegal ones count as 0)."""
    from types import SimpleNamespace

    from ppo_lightning.algos.hooks import logit_l2
    from ppo_lightning.nets.composite import mask_logits

    logits = torch.tensor([[1.0, -2.0, 3.0], [0.5, 0.5, 0.5]])
    mask = torch.tensor([[True, False, True], [True, True, True]])
    got = logit_l2(SimpleNamespace(dist_params=[mask_logits(logits, mask)]))
    torch.testing.assert_close(got, torch.tensor([0.5 * (1 + 9) / 3, 0.5 * 0.25]))
