"""Data side: no fake transitions, GAE bootstraps only on truncation, normalizers, config errors."""

import math

import pytest
import torch
from tensordict import TensorDict

from ppo_lightning.algos.advantages import AdvantageMoments, RewardNormalizer, ewma_beta_from_span, make_gae, next_values
from ppo_lightning.data.datamodule import RolloutDataModule
from ppo_lightning.envs import make_env
from ppo_lightning.nets.models import ActorCritic


def collect(env_id="CartPole-v1", num_envs=4, steps=200, seed=0):
    dm = RolloutDataModule(env_id=env_id, num_envs=num_envs, rollout_steps=steps, num_minibatches=1, seed=seed)
    net = ActorCritic(dm.observation_space, dm.action_space, hidden_sizes=(8,))
    source = dm.make_source(net)
    return dm, net, source, source.rollouts()[0]


def test_no_fake_transition_reaches_a_batch():
    dm, _, source, rollout = collect()
    done = rollout["next", "done"].squeeze(-1)
    assert done.any(), "the test needs episode ends inside the rollout"
    # CartPole pays 1 on every real step: an autoreset's fake transition would pay 0.
    assert torch.all(rollout["next", "reward"] == 1.0)
    obs, next_obs = rollout["observation"], rollout["next", "observation"]
    cont = ~done[:, :-1]
    assert torch.equal(next_obs[:, :-1][cont], obs[:, 1:][cont])  # next_obs[t] == obs[t+1] within episodes
    # After an end, the next step starts from a reset state (CartPole resets within +-0.05).
    after_end = obs[:, 1:][done[:, :-1]]
    assert after_end.abs().max() <= 0.05
    # Episode lengths add up: every ended episode's step_count equals its return (reward 1 per step).
    torch.testing.assert_close(rollout["next", "episode_reward"][done].squeeze(-1),
                               rollout["next", "step_count"][done].squeeze(-1).float())
    assert dm.states[0].episodes.count == int(done.sum())
    source.collector.shutdown()


def hand_gae(rewards, values, next_values, terminated, done, gamma, lam):
    adv, last = [0.0] * len(rewards), 0.0
    for t in reversed(range(len(rewards))):
        nonterminal = 0.0 if terminated[t] else 1.0
        delta = rewards[t] + gamma * next_values[t] * nonterminal - values[t]
        last = delta + gamma * lam * (0.0 if done[t] else 1.0) * last
        adv[t] = last
    return adv


@pytest.mark.parametrize("end", ["terminated", "truncated"])
def test_gae_bootstraps_on_truncation_only(end):
    gamma, lam = 0.9, 0.8
    T = 4
    obs = torch.arange(T, dtype=torch.float32).reshape(1, T, 1)
    next_obs = obs + 1
    next_obs[0, 1] = 100.0  # the final observation of the episode ending at t = 1
    value_fn = lambda o: 0.5 * o  # noqa: E731
    terminated = torch.zeros(1, T, 1, dtype=torch.bool)
    truncated = torch.zeros(1, T, 1, dtype=torch.bool)
    (terminated if end == "terminated" else truncated)[0, 1] = True
    done = terminated | truncated
    rollout = TensorDict(
        {"observation": obs, "state_value": value_fn(obs),
         "next": {"observation": next_obs, "reward": torch.ones(1, T, 1), "done": done,
                  "terminated": terminated, "truncated": truncated}},
        batch_size=[1, T],
    )
    rollout.set(("next", "state_value"), next_values(rollout, value_fn))
    nv = rollout["next", "state_value"].flatten().tolist()
    assert nv[1] == 50.0  # V(final observation), not V(next episode's first observation)
    make_gae(gamma, lam)(rollout)
    expected = hand_gae([1.0] * T, value_fn(obs).flatten().tolist(), nv, terminated.flatten().tolist(),
                        done.flatten().tolist(), gamma, lam)
    torch.testing.assert_close(rollout["advantage"].flatten(), torch.tensor(expected))


def test_advantage_moments_span_one_is_batch_normalization_and_weighting():
    assert ewma_beta_from_span(1) == 0.0
    m = AdvantageMoments(span=1)
    a = torch.tensor([1.0, 2.0, 3.0, 6.0])
    m.update(a)
    assert m.mean == pytest.approx(3.0) and m.var == pytest.approx(a.var(unbiased=False).item())
    # span 2 -> beta 1 - 1/2 = 0.5; two batches of sizes 2 and 4, weighted by sample count.
    m = AdvantageMoments(span=2)
    b1, b2 = torch.tensor([0.0, 2.0]), torch.tensor([1.0, 1.0, 3.0, 3.0])
    m.update(b1), m.update(b2)
    w = 0.5 * 2 + 4
    s = 0.5 * 2 * 1.0 + 4 * 2.0
    q = 0.5 * 2 * (1.0 + 1.0) + 4 * (1.0 + 4.0)
    assert m.mean == pytest.approx(s / w) and m.var == pytest.approx(q / w - (s / w) ** 2)


@pytest.mark.parametrize("span", [1, 2, 4, 16])
def test_advantage_span_is_a_window_of_span_iterations(span):
    """Span s = a window of s iterations (issue 11): with equal batches, the weights of past iterations
    sum to s batches' worth, and a shift in the advantage mean reaches 1 - 1/e of its size after
    about s iterations; the old pandas convention (beta = 1 - 2/(s+1)) gave (s+1)/2."""
    beta = ewma_beta_from_span(span)
    assert beta == pytest.approx(1 - 1 / span)
    m = AdvantageMoments(span=span)
    n = 8
    for _ in range(400):
        m.update(torch.zeros(n))
    assert m.w / n == pytest.approx(span, rel=1e-6)  # total weight = span iterations
    # Step response: after j iterations of mean 1, the estimated mean is 1 - beta**j.
    steps = 0
    while m.mean < 1 - math.exp(-1):
        m.update(torch.ones(n))
        steps += 1
    assert steps == max(1, math.ceil(-1 / math.log(beta))) if span > 1 else steps == 1
    assert abs(steps - span) <= 1
    # batch_size_scaling keeps span * c: at c = 4 per-batch normalization becomes a 4-iteration window
    from ppo_lightning.algos.scaling import batch_size_scaling

    scaled = batch_size_scaling(4, lr=1e-3, proximal_com=None, adv_norm_span=float(span))["adv_norm_span"]
    assert scaled == 4 * span and ewma_beta_from_span(scaled) == pytest.approx(1 - 1 / (4 * span))


def test_reward_normalizer_matches_hand_loop():
    gamma = 0.9
    norm = RewardNormalizer(num_envs=2, gamma=gamma)
    r = torch.tensor([[1.0, 2.0, 3.0], [0.5, 0.5, 0.5]]).unsqueeze(-1)
    d = torch.tensor([[False, True, False], [False, False, False]]).unsqueeze(-1)
    out = norm(r, d)
    rets = [[1.0, 2.9, 3.0], [0.5, 0.95, 1.355]]
    flat = torch.tensor(rets).flatten()
    count = 1e-4 + 6
    mean = flat.mean().item() * 6 / count
    var = (flat.var(unbiased=False).item() * 6 + flat.mean().item() ** 2 * 1e-4 * 6 / count) / count
    torch.testing.assert_close(out, (r / math.sqrt(var + 1e-8)).clamp(-10, 10), rtol=1e-4, atol=1e-5)
    assert norm.ret.tolist() == pytest.approx([3.0, 1.355])
    assert norm.mean == pytest.approx(mean)


def test_minibatches_cover_the_batch_each_epoch():
    dm = RolloutDataModule(num_envs=4, rollout_steps=8, num_minibatches=4, update_epochs=3, seed=0)
    net = ActorCritic(dm.observation_space, dm.action_space, hidden_sizes=(8,))
    source = dm.make_source(net)
    batches = list(source)
    # [S, B]: a single run is one member
    assert len(batches) == len(source) == 12 and all(tuple(b.shape) == (1, 8) for b in batches)
    for e in range(3):
        obs = torch.cat([b["observation"][0] for b in batches[4 * e: 4 * e + 4]])
        assert obs.shape[0] == 32 and torch.unique(obs, dim=0).shape[0] == 32
    adv = torch.cat([b["advantage"][0] for b in batches[:4]])
    assert adv.mean().abs() < 1e-5 and adv.std(unbiased=False) == pytest.approx(1.0, abs=1e-3)
    source.collector.shutdown()


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"env_id": "NoSuchEnv-v9"}, "data.env_id"),
        ({"num_envs": 0}, "data.num_envs"),
        ({"num_envs": 3, "rollout_steps": 5, "num_minibatches": 4}, "data.num_minibatches"),
        ({"gamma": 1.5}, "data.gamma"),
        ({"advantage_norm_span": 0.5}, "data.advantage_norm_span"),
    ],
)
def test_invalid_data_config_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        RolloutDataModule(**kwargs)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"lr": 0.0}, "model.lr"),
        ({"lr": -1e-3}, "model.lr"),
        ({"clip_eps": 0.0}, "model.clip_eps"),
        ({"decoupled": True, "proximal_com": -1.0}, "model.proximal_com"),
        ({"proximal_com": 8.0}, "model.proximal_com"),
        ({"objective": "trpo"}, "model.objective"),
        ({"network": {"name": "mlp", "activation": "swish"}}, "model.activation"),
    ],
)
def test_invalid_model_config_names_the_field(kwargs, field):
    from ppo_lightning.training.module import PPOLightningModule

    spaces = ({"shape": [4], "dtype": "float32"}, {"type": "discrete", "n": 2})
    with pytest.raises(ValueError, match=field):
        PPOLightningModule(*spaces, **kwargs)


def test_gymnasium_continuous_env_batched():
    env = make_env("Pendulum-v1", 3, seed=0)
    td = env.rollout(5)
    assert td.batch_size == torch.Size([3, 5]) and td["action"].shape == (3, 5, 1)
    env.close()


def test_data_parallel_ranks_collect_different_data_and_count_all_frames():
    from types import SimpleNamespace

    from lightning.pytorch.plugins.precision import Precision

    from ppo_lightning.data.datamodule import rank_seed
    from ppo_lightning.nets.models import ActorCritic

    assert rank_seed(7, 0) == 7 and len({rank_seed(0, r) for r in range(4)}) == 4
    firsts = []
    for rank in (0, 1):
        dm = RolloutDataModule(num_envs=2, rollout_steps=8, num_minibatches=2, update_epochs=1, seed=0)
        dm.trainer = SimpleNamespace(global_rank=rank, world_size=2, precision_plugin=Precision())  # 32-true
        torch.manual_seed(0)
        source = dm.make_source(ActorCritic(dm.observation_space, dm.action_space, hidden_sizes=(8,)), dm.trainer)
        firsts.append(source.rollouts()[0].get("observation")[:, 0])
        source.collector.shutdown()
        assert dm.frames == 2 * 16  # both ranks' frames
    assert not torch.allclose(firsts[0], firsts[1])


def test_batched_minatar_rollout_equals_the_collectors_bitwise():
    """MinAtar's batched rollout (no TorchRL collector) gives the collector's rollouts bitwise: every
    key, over three rollouts with episode ends and time-limit truncations inside, drawing the same
    random numbers (torch's generator ends in the same state)."""
    from ppo_lightning.data.batched_rollout import BatchedRollout
    from ppo_lightning.nets.models import build_network

    out = []
    for batched in (False, True):
        dm = RolloutDataModule(env_id="minatar:breakout", env_kwargs={"max_episode_steps": 25}, num_envs=3,
                               rollout_steps=40, num_minibatches=1, seed=5, batched_rollout=batched)
        torch.manual_seed(0)
        net = build_network(dm.observation_space, dm.action_space, {"name": "minatar_cnn", "channels": 4, "hidden": 16})
        source = dm.make_source(net)
        assert isinstance(source.collector, BatchedRollout) == batched
        rollouts = [source._next_rollouts()[0] for _ in range(3)]
        out.append((rollouts, torch.get_rng_state(), dm.states[0].episodes.state_dict()))
        source.collector.shutdown()
    (ref, ref_rng, ref_eps), (got, got_rng, got_eps) = out
    for a, b in zip(ref, got):
        a = a.exclude("collector")
        assert set(a.keys(True, True)) == set(b.keys(True, True))
        for k in a.keys(True, True):
            assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    done = torch.cat([r["next", "done"] for r in ref])
    assert done.sum() >= 3 and torch.cat([r["next", "truncated"] for r in ref]).any()  # ends and cuts inside
    assert torch.equal(ref_rng, got_rng) and ref_eps == got_eps
