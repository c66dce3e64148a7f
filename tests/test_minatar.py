"""MinAtar (issue 11): the env, the CNN, the normalized-score table, the statistics, the noise scale
and a --quick run of the figure driver."""

import csv
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ppo_lightning.envs import check_env_id, env_spaces, make_env
from ppo_lightning.envs.minatar_env import GAMES, MinAtarTorchEnv
from ppo_lightning.nets.models import build_network

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))


def _random_actions(n, steps, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 6, (n,), generator=g) for _ in range(steps)]


@pytest.mark.parametrize("game", GAMES)
def test_spec_and_reset_step(game):
    from torchrl.envs.utils import check_env_specs

    env = make_env(f"minatar:{game}", 3, seed=0)
    check_env_specs(env)
    obs_space, act_space = env_spaces(f"minatar:{game}")
    td = env.reset()
    assert list(td["observation"].shape) == [3, *obs_space["shape"]] and td["observation"].dtype == torch.bool
    assert act_space == {"type": "discrete", "n": 6}
    td["action"] = torch.zeros(3, dtype=torch.int64)
    out = env.step(td)["next"]
    assert out["reward"].shape == (3, 1) and out["done"].shape == (3, 1)
    assert (out["step_count"] == 1).all()


def test_unknown_game_is_a_clear_error():
    with pytest.raises(ValueError, match="data.env_id: unknown MinAtar game 'pong'"):
        check_env_id("minatar:pong")


def test_seeding_is_deterministic_and_seeds_differ():
    def trajectory(seed):
        env = make_env("minatar:asterix", 4, seed=seed)
        td = env.reset()
        obs, rew = [], []
        for a in _random_actions(4, 60):
            td["action"] = a
            td = env.step(td)
            obs.append(td["next", "observation"].clone()), rew.append(td["next", "reward"].clone())
            td = env.step_mdp(td)
            if td["done"].any():
                td["_reset"] = td["done"].clone()
                td = env.reset(td)
        return torch.stack(obs), torch.stack(rew)

    o1, r1 = trajectory(7)
    o2, r2 = trajectory(7)
    o3, _ = trajectory(8)
    assert torch.equal(o1, o2) and torch.equal(r1, r2)
    assert not torch.equal(o1, o3)


def test_frames_and_episodes_counted_and_final_obs_kept():
    """Episode statistics match a hand count; the observation with done is the final one (the
    partial reset restarts only the ended games); truncation at max_episode_steps is 'truncated'."""
    env = make_env("minatar:breakout", 4, seed=0)
    rollout = env.rollout(200, break_when_any_done=False, policy=None)
    done = rollout["next", "done"].squeeze(-1)
    rew = rollout["next", "reward"].squeeze(-1)
    assert rollout.numel() == 800 and done.any()
    for i in range(4):  # returns and lengths of every finished episode, by hand
        start = 0
        for t in torch.nonzero(done[i]).flatten().tolist():
            assert rollout["next", "episode_reward"][i, t].item() == pytest.approx(rew[i, start:t + 1].sum().item())
            assert rollout["next", "step_count"][i, t].item() == t + 1 - start
            start = t + 1
    assert rollout["next", "terminated"].equal(rollout["next", "done"])  # Breakout ends only by losing
    short = MinAtarTorchEnv("freeway", 2, seed=0, max_episode_steps=5)
    td = short.reset()
    for _ in range(5):
        td["action"] = torch.zeros(2, dtype=torch.int64)
        td = short.step(td)
        nxt = td["next"]
        td = short.step_mdp(td)
    assert nxt["truncated"].all() and not nxt["terminated"].any() and nxt["done"].all()
    with pytest.raises(ValueError, match="sticky_action_prob"):
        MinAtarTorchEnv("breakout", 1, sticky_action_prob=1.5)


@pytest.mark.parametrize("network", [{"name": "minatar_cnn"}, {"name": "minatar_cnn", "shared_trunk": False},
                                     {"name": "impala_cnn", "channels": [16, 32], "dense": 64}])
def test_networks_on_minatar_observations(network):
    obs_space, act_space = env_spaces("minatar:seaquest")
    net = build_network(obs_space, act_space, network)
    obs = torch.rand(2, 5, *obs_space["shape"]) > 0.5
    logits, value = net(obs)
    assert logits.shape == (2, 5, 6) and value.shape == (2, 5, 1)
    torch.testing.assert_close(net.policy(obs)[0], logits)
    torch.testing.assert_close(net.value(obs), value)
    if network["name"] == "minatar_cnn":  # conv 16 @ 3x3 on 10x10x10 -> 8x8x16 -> 128
        n = sum(p.numel() for p in net.policy_body.parameters())
        assert n == (3 * 3 * 10 * 16 + 16) + (8 * 8 * 16 * 128 + 128)
    with pytest.raises(ValueError, match="model.network"):
        build_network(obs_space, {"type": "continuous", "shape": [2]}, network)


# ------------------------------------------------------------------ normalized-score table
def test_score_table_matches_the_measurements():
    from ppo_lightning.envs.minatar_scores import RETURN_RANGES, mean_normalized_return, normalized_return

    out = ROOT / "experiments" / "results" / "minatar"
    with open(out / "random_returns.csv") as f:
        random = {r["game"]: float(r["mean_return"]) for r in csv.DictReader(f)}
    with open(out / "reference_runs.csv") as f:
        ref: dict[str, list[float]] = {}
        for r in csv.DictReader(f):  # the table's R_ref: the 300k PPO runs (arm "ppo"); the 500k base's
            if r.get("arm", "ppo") == "ppo":  # references (other arms) are REFERENCE_500K's (next test)
                ref.setdefault(r["game"], []).append(float(r["final_return"]))
    assert set(RETURN_RANGES) == set(GAMES) == set(random) and set(ref) <= set(GAMES) and ref
    for g in set(GAMES) - set(ref):  # no reference run at this budget: a clear error, not a number
        assert RETURN_RANGES[g][0] == pytest.approx(random[g], abs=1e-4)
        with pytest.raises(ValueError, match="no R_ref"):
            normalized_return(g, 1.0)
    for g in ref:
        r_random, r_ref = RETURN_RANGES[g]
        assert r_random == pytest.approx(random[g], abs=1e-4)
        assert r_ref == pytest.approx(float(np.mean(ref[g])), abs=1e-3)
        assert r_ref > r_random  # PPO learned something on every game
        assert normalized_return(g, r_random) == pytest.approx(0.0) and normalized_return(g, r_ref) == pytest.approx(1.0)
    mid = {g: (RETURN_RANGES[g][0] + RETURN_RANGES[g][1]) / 2 for g in ref}
    assert mean_normalized_return({**mid, "breakout": float("nan")}) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="no normalized-return constants"):
        normalized_return("pong", 1.0)


def test_shipped_500k_references_are_the_recorded_runs():
    """`score: minatar-500k` reads constants shipped with the package (a study file outside the
    repository scores the same); they are the records' 1M+-frame reference runs."""
    from ppo_lightning.envs.minatar_scores import REFERENCE_500K
    from ppo_lightning.studies.records import reference_returns

    measured = reference_returns(ROOT)
    assert set(measured) == set(REFERENCE_500K)
    for game, r_ref in REFERENCE_500K.items():
        assert r_ref == pytest.approx(measured[game], abs=1e-4)


def test_game_without_reference_run_is_a_clear_error(monkeypatch):
    from ppo_lightning.envs import minatar_scores

    monkeypatch.setitem(minatar_scores.RETURN_RANGES, "freeway", (0.13, float("nan")))
    with pytest.raises(ValueError, match="no R_ref measured for MinAtar game 'freeway'"):
        minatar_scores.normalized_return("freeway", 1.0)


# ------------------------------------------------------------------ statistics
def test_noise_scale_recovers_a_known_gradient_noise():
    """Minibatch gradients g_i = G + noise/sqrt(b) with per-sample covariance s^2 I: B_simple = P s^2 / |G|^2."""
    from ppo_lightning.training.noise_scale import noise_scale_terms

    rng = torch.Generator().manual_seed(0)
    P, b, k, s = 50, 32, 8, 2.0
    G = torch.full((P,), 0.5)
    sums_g2 = sums_tr = 0.0
    for _ in range(400):
        grads = G + s / math.sqrt(b) * torch.randn(k, P, generator=rng, dtype=torch.float64)
        g2, tr = noise_scale_terms(grads, b)
        sums_g2 += g2
        sums_tr += tr
    assert sums_g2 / 400 == pytest.approx(float(G.pow(2).sum()), rel=0.05)
    assert sums_tr / 400 == pytest.approx(P * s * s, rel=0.05)
    assert sums_tr / sums_g2 == pytest.approx(P * s * s / float(G.pow(2).sum()), rel=0.08)


def test_streamed_noise_scale_norms_equal_the_stacked_ones():
    """The callback's running sums give the terms `noise_scale_terms` computes from the stacked
    minibatch gradients, per row (seed), with gradients split into parameter pieces."""
    from ppo_lightning.training.noise_scale import NormAccumulator, noise_scale_from_norms, noise_scale_terms

    rng = torch.Generator().manual_seed(1)
    rows, k, b = 3, 5, 16
    grads = [[torch.randn(rows, n, generator=rng) + 0.3 for n in (7, 40, 1)] for _ in range(k)]
    acc = NormAccumulator()
    for g in grads:
        acc.add(g)
    assert all(g[0].dtype == torch.float32 for g in grads) and acc.k == k
    small, big = acc.norms()
    for r in range(rows):
        stacked = torch.stack([torch.cat([piece[r] for piece in g]) for g in grads])  # [k, P]
        expect = noise_scale_terms(stacked, b)
        got = noise_scale_from_norms(float(small[r]), float(big[r]), k, b)
        assert got == pytest.approx(expect, rel=1e-5)  # float32 sums and norms
    with pytest.raises(ValueError, match="at least 2"):
        noise_scale_from_norms(1.0, 1.0, 1, b)


# ------------------------------------------------------------------ the figure driver
@pytest.mark.parametrize("arch", ["dual", "shared", "detach"])
def test_minatar_cnn_in_ppg_layouts(arch):
    """PPG's layouts on the MinAtar CNN: forward_aux = forward plus the auxiliary value on the policy
    trunk; "dual" has a value trunk of its own; "detach" sends no value gradient into the trunk."""
    obs_space, act_space = env_spaces("minatar:breakout")
    net = build_network(obs_space, act_space, {"name": "minatar_cnn", "arch": arch, "aux_value_head": True})
    obs = torch.rand(3, *obs_space["shape"]) > 0.5
    logits, value, aux = net.forward_aux(obs)
    torch.testing.assert_close((logits, value), net(obs))
    assert aux.shape == (3, 1) and (net.value_body is not None) == (arch == "dual")
    net.zero_grad()
    net.value(obs).sum().backward()
    trunk_grad = net.policy_body.dense.weight.grad
    assert (trunk_grad is None or not trunk_grad.any()) == (arch != "shared")
    with pytest.raises(ValueError, match="shared_trunk"):
        build_network(obs_space, act_space, {"name": "minatar_cnn", "arch": "dual", "shared_trunk": True})


def test_reference_kl_form_is_half_squared_log_ratio():
    """model.kl_form=sq_logratio: the penalty is beta * 0.5 (log pi(a) - log pi_prox(a))^2 (reference code)."""
    from tensordict import TensorDict

    from ppo_lightning.algos.loss import PPOFamilyLoss
    from ppo_lightning.nets.models import ActorCritic, make_distribution

    torch.manual_seed(0)
    space = {"type": "discrete", "n": 3}
    net = ActorCritic({"shape": [4]}, space, hidden_sizes=(8,))
    obs = torch.randn(16, 4)
    logits, _ = net(obs)
    logits = logits.detach()
    prox = logits + 0.3 * torch.randn_like(logits)
    action = make_distribution(space, logits).sample()
    td = TensorDict({"observation": obs, "action": action, "logits": logits,
                     "action_log_prob": make_distribution(space, logits).log_prob(action),
                     "advantage": torch.zeros(16, 1), "value_target": torch.zeros(16, 1),
                     "state_value": torch.zeros(16, 1), "proximal": TensorDict({"logits": prox}, [16])}, [16])
    loss = PPOFamilyLoss(net, space, objective="kl", decoupled=True, kl_beta=2.0, kl_form="sq_logratio")
    out = loss(td)
    lp = make_distribution(space, logits).log_prob(action)
    lp_prox = make_distribution(space, prox).log_prob(action)
    # advantages are zero: the objective is -(-beta * KL) = beta * mean(0.5 (lp - lp_prox)^2)
    assert out["loss_objective"].item() == pytest.approx((2.0 * 0.5 * (lp - lp_prox) ** 2).mean().item(), rel=1e-5)
    with pytest.raises(ValueError, match="model.kl_form"):
        PPOFamilyLoss(net, space, kl_form="exact")


def test_quick_run_of_the_noise_scale_probe(tmp_path):
    """The fixed-parameter probe runs and writes B_simple for the policy terms, the value term, their
    sum and each parameter tensor; the parameters do not move while it measures."""
    import noise_scale_probe

    out = tmp_path / "ns.csv"
    noise_scale_probe.main(["--quick", "--out", str(out)])
    rows = list(csv.DictReader(open(out)))
    losses = {r["loss"] for r in rows}
    assert {"policy", "value", "total", "policy:policy_head.weight"} <= losses
    assert all(int(r["b_big"]) == 256 and int(r["b_small"]) == 32 for r in rows)
    assert all(float(r["trace_cov"]) > 0 for r in rows if ":" not in r["loss"])
