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
        for r in csv.DictReader(f):  # the table's R_ref: issue 11's PPO runs (arm "ppo"); issue 19's
            if r.get("arm", "ppo") == "ppo":  # 500k-base references (other arms) are not adopted yet
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


def test_game_without_reference_run_is_a_clear_error(monkeypatch):
    from ppo_lightning.envs import minatar_scores

    monkeypatch.setitem(minatar_scores.RETURN_RANGES, "freeway", (0.13, float("nan")))
    with pytest.raises(ValueError, match="no R_ref measured for MinAtar game 'freeway'"):
        minatar_scores.normalized_return("freeway", 1.0)


# ------------------------------------------------------------------ statistics
def test_bootstrap_ci_and_seed_count_on_a_known_case():
    from stats import bootstrap_ci, bootstrap_diff_ci, curve_auc, final_value, pooled_scores, seeds_needed

    # Known case: N(0.5, 0.2^2) samples; the 95% CI of the mean has half-width ~1.96 * 0.2 / sqrt(n).
    rng = np.random.default_rng(0)
    x = rng.normal(0.5, 0.2, size=400)
    m, lo, hi = bootstrap_ci(x)
    assert m == pytest.approx(x.mean()) and lo < m < hi
    assert (hi - lo) / 2 == pytest.approx(1.96 * x.std(ddof=1) / math.sqrt(400), rel=0.1)
    # Coverage: over many repeated 10-seed experiments the CI holds the true mean ~95% of the time (percentile
    # bootstrap with small n under-covers a little).
    hits = sum(lo <= 0.5 <= hi for lo, hi in (bootstrap_ci(rng.normal(0.5, 0.2, 10), n_boot=1000, seed=i)[1:]
                                                for i in range(200)))
    assert 0.85 <= hits / 200 <= 0.99
    d, lo, hi = bootstrap_diff_ci(x + 0.1, x)
    assert d == pytest.approx(0.1) and lo < 0.1 < hi
    # sd 0.2, half-width 0.05: (1.96 * 0.2 / 0.05)^2 = 61.5 -> 62 seeds; a difference needs twice that.
    assert seeds_needed(0.2, 0.05) == 62 and seeds_needed(0.2, 0.05, arms=2) == 123 and seeds_needed(0.0) == 2
    assert pooled_scores({"a": [0.0, 1.0], "b": [1.0, 1.0]}).tolist() == [0.5, 1.0]
    # AUC of a step curve: 0 until 50, then 1 until 100 -> 0.5; final = mean of points in the last 10%.
    assert curve_auc([(10, 0.0), (50, 1.0), (100, 1.0)], 100) == pytest.approx(0.5)
    assert final_value([(10, 0.0), (50, 1.0), (95, 3.0), (100, 5.0)], 100) == pytest.approx(4.0)


def test_small_seed_counts_get_t_intervals():
    """Below 5 seeds the driver's CIs are Student / Welch t intervals: a hand-computed case and scipy's
    own Welch test as oracles, and at n = 3 they are wider than the percentile bootstrap."""
    from scipy.stats import ttest_ind
    from stats import bootstrap_diff_ci, t_ci, welch_diff_ci

    # [1, 2, 3]: mean 2, s = 1, t(0.975, 2) = 4.3027 -> 2 +- 4.3027 / sqrt(3) = 2 +- 2.4841
    m, lo, hi = t_ci([1.0, 2.0, 3.0])
    assert m == 2.0 and (lo, hi) == (pytest.approx(2 - 2.4841, abs=1e-4), pytest.approx(2 + 2.4841, abs=1e-4))
    # against a constant arm, Welch reduces to the one-sample interval (dof n_a - 1)
    assert welch_diff_ci([1.0, 2.0, 3.0], [0.0, 0.0, 0.0])[1:] == pytest.approx((2 - 2.4841, 2 + 2.4841), abs=1e-4)
    rng = np.random.default_rng(1)
    a, b = rng.normal(0.2, 0.05, 3), rng.normal(0.1, 0.02, 4)
    d, lo, hi = welch_diff_ci(a, b)
    ci = ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert d == pytest.approx(a.mean() - b.mean()) and (lo, hi) == (pytest.approx(ci.low), pytest.approx(ci.high))
    _, blo, bhi = bootstrap_diff_ci(a, b)
    assert hi - lo > bhi - blo
    assert math.isnan(welch_diff_ci([1.0], [0.0, 1.0])[1])  # one seed has no interval


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
def test_quick_runs_of_the_figure_driver(tmp_path, monkeypatch):
    """Each figure's --quick sweep runs, writes its CSVs (with the run's exact config), analyzes, plots,
    and a rerun skips the finished runs (resumable)."""
    import minatar_figures

    from ppo_lightning.envs import minatar_scores

    monkeypatch.setitem(minatar_scores.RETURN_RANGES, "breakout", (0.5, 10.0))  # independent of the measured table
    common = ["--quick", "--games", "breakout", "--out", str(tmp_path), "--run-root", str(tmp_path / "runs")]
    for figure, arm in (("ewma", "ppo_ewma"), ("bsi", "c4_no_lr"), ("staleness", "k2_decoupled"), ("klcom", "beta1_com8")):
        minatar_figures.main([figure, "--arms", arm, *common])
        with open(tmp_path / f"{figure}_runs.csv") as f:
            (row,) = list(csv.DictReader(f))
        assert row["arm"] == arm and '"--data.env_id", "minatar:breakout"' in row["args"] and row["B_simple"]
        assert '"--model.max_importance_ratio", "100"' in row["args"]  # the cap in every arm
        assert row["cpu"] == minatar_figures.cpu_label()  # each run names the CPU it ran on
        assert (tmp_path / f"{figure}.png").exists() and (tmp_path / f"{figure}_summary.csv").exists()
        if figure == "staleness":  # 4096 frames = 8 iterations of 512: the 2 start-up rollouts not counted
            assert int(row["frames"]) == 4096 and int(row["iterations"]) == 8
        if figure == "bsi":  # c = 4: minibatch 512 / 8 / 4 = 16, lr not scaled, COM and span scaled
            assert int(row["minibatch_size"]) == 16 and '"--scale_rules", "com,adv_span"' in row["args"]
    minatar_figures.main(["ewma", "--arms", "ppo_ewma", *common])
    assert len(list(csv.DictReader(open(tmp_path / "ewma_runs.csv")))) == 1  # nothing rerun
    # PPG-EWMA with all rules at c = 4 (its policy phase has E_pi = 1: 2 steps per iteration here)
    minatar_figures.main(["bsi", "--arms", "c4_ppg_ewma", *common])
    row = [r for r in csv.DictReader(open(tmp_path / "bsi_runs.csv")) if r["arm"] == "c4_ppg_ewma"][0]
    assert "ppg_ewma.yaml" in row["args"] and int(row["minibatch_size"]) == 16
    assert int(row["gradient_steps"]) > 2 * int(row["iterations"])  # auxiliary-phase steps too


def test_a_results_plot_is_labelled_with_its_runs_cpus_not_the_drawing_machines(tmp_path):
    import minatar_figures

    pyplot = minatar_figures.plt()
    fig, _ = pyplot.subplots()
    rows = [{"cpu": "CPU: B"}, {"cpu": "CPU: A"}, {"cpu": ""}, {"cpu": "CPU: A"}]
    minatar_figures.save_labelled(fig, tmp_path / "runs.png", rows)
    assert [t.get_text() for t in fig.texts] == ["runs on CPU not recorded + CPU: A + CPU: B"]
    fig, _ = pyplot.subplots()
    minatar_figures.save_labelled(fig, tmp_path / "probe.png")
    assert [t.get_text() for t in fig.texts] == [minatar_figures.cpu_label()]


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


def test_500k_figures_are_normalized_by_the_500k_base_reference(tmp_path, monkeypatch):
    """Issue 19's figures pool games by R_ref of the tuned 500k base (its reference runs), not issue 11's
    table; without such a run the analysis stops with the command that makes it."""
    import minatar_figures as mf

    from ppo_lightning.envs import minatar_scores

    monkeypatch.setitem(minatar_scores.RETURN_RANGES, "breakout", (0.5, 4.0))  # issue 11's R_ref: must not be used
    ppo, ewma = f"ppo_{mf.LR}", f"ppo_ewma_{mf.LR}"
    for arm, finals in ((ppo, (2.5, 4.5)), (ewma, (6.5, 8.5))):
        for seed, final in enumerate(finals):
            mf.record_run(tmp_path / "ewma500k_runs.csv", tmp_path / "ewma500k_curves.csv",
                          {"figure": "ewma500k", "arm": arm, "game": "breakout", "seed": seed, "frames": 500_000,
                           "final_return": final, "auc_return": final / 2, "wall_s": 1.0},
                          [(250_000.0, final / 2), (500_000.0, final)])
    with pytest.raises(SystemExit, match=f"reference --arms {mf.REF500K_ARM} --games breakout"):
        mf.analyze("ewma500k", tmp_path, [(ewma, ppo)])
    for frames, final in ((mf.REF500K_MIN_FRAMES // 2, 99.0), (mf.REF500K_FRAMES, 10.5)):  # too short: ignored
        mf.append_row(tmp_path / "reference_runs.csv", {"figure": "reference", "arm": mf.REF500K_ARM, "game": "breakout",
                                                        "seed": 1000, "frames": frames, "final_return": final},
                      mf.RUN_FIELDS)
    summary = {(r["row"], r["stat"]): r for r in mf.analyze("ewma500k", tmp_path, [(ewma, ppo)])}
    assert summary[(ppo, "final")]["mean"] == pytest.approx(0.3)  # ((2.5 - 0.5) / 10 + (4.5 - 0.5) / 10) / 2
    diff = summary[(f"{ewma} - {ppo}", "final")]
    assert diff["mean"] == pytest.approx(0.4)
    # 2 seeds per arm: Welch's t interval (the bootstrap would give [0.4, 0.4]), and the verdict says so
    from stats import welch_diff_ci
    assert (diff["ci_low"], diff["ci_high"]) == pytest.approx(welch_diff_ci([0.6, 0.8], [0.2, 0.4])[1:])
    assert diff["verdict"] == "not resolved (Welch t, n=2)"
    assert (tmp_path / "ewma500k.png").exists()


def test_a_run_stopped_by_a_signal_is_not_recorded(tmp_path, monkeypatch):
    """A fit stopped by SIGTERM returns normally (exit_code 128 + n, fewer frames): the figure driver
    stops with that code and writes no row, so a rerun trains the run again (a stopped group was
    once recorded as five finished 4k-frame runs)."""
    import types

    import minatar_figures as mf

    from ppo_lightning.cli import fit as fit_module

    stopped = types.SimpleNamespace(exit_code=143, datamodule=types.SimpleNamespace(frames=4096))
    monkeypatch.setattr(fit_module, "fit_main", lambda *a, **k: stopped)
    args = ["--games", "breakout", "--seeds", "2", "--frames", "500000", "--out", str(tmp_path), "--run-root",
            str(tmp_path / "runs"), "--arms", "c1_lr4x"]
    for extra in ([], ["--one-by-one"]):  # a vectorized group, and one run per seed
        with pytest.raises(SystemExit) as stop:
            mf.main(["lr500k", *args, *extra])
        assert stop.value.code == 143 and not (tmp_path / "lr500k_runs.csv").exists()


def test_a_continued_group_counts_the_time_of_its_earlier_attempts(tmp_path):
    """A group stopped and continued logs each attempt to a new MLflow run of its name: the budget
    (wall_s, train_s) sums them; another group's runs, and those of a set-aside attempt (started
    before the group's stamp), are not counted."""
    import time

    import minatar_figures as mf
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.create_experiment("minatar-bsi500k")

    def attempt(name, elapsed):
        run = client.create_run(exp, run_name=name)
        for step, value in enumerate(elapsed):
            client.log_metric(run.info.run_id, "time/elapsed_s", value, step=step)
        return run.info.run_id

    attempt("g", [5.0, 50.0])  # set aside: before the stamp
    time.sleep(0.05)
    since = time.time()
    time.sleep(0.05)
    attempt("g", [10.0, 100.0, 120.0])  # stopped after 120 s
    attempt("g", [1.0, 30.0])  # stopped again
    attempt("other", [1000.0])
    current = attempt("g", [7.0])
    assert mf.earlier_attempts_s(client, exp, "g", current, since) == pytest.approx(150.0)
    assert mf.earlier_attempts_s(client, exp, "g", current, 0.0) == pytest.approx(200.0)


def test_a_killed_group_resumes_from_its_checkpoint_and_ends_as_an_uninterrupted_one(tmp_path, monkeypatch):
    """A vectorized group of the figure driver checkpoints as it trains; stopped mid-run (SIGTERM: the
    sweep exits 143, no rows), a rerun of the sweep continues it from last.ckpt and records the same
    rows as a group that was never stopped, then deletes its checkpoints. A checkpoint written with
    other arguments is set aside, not resumed."""
    import json

    import minatar_figures as mf

    from ppo_lightning.envs import minatar_scores

    sys.path.insert(0, str(ROOT / "tests"))  # cluster_helpers.SignalAt, by class path
    monkeypatch.setitem(minatar_scores.RETURN_RANGES, "breakout", (0.5, 10.0))
    monkeypatch.setattr(mf, "CHECKPOINT_FRAMES", 4096)  # a checkpoint every iteration (4096 frames at c = 1)
    base_args = mf.base_args
    signal_at = json.dumps({"class_path": "cluster_helpers.SignalAt",
                            "init_args": {"signum": "SIGTERM", "phase": "update", "iteration": 2}})
    stopped_args = lambda *a: base_args(*a) + [f"--trainer.callbacks+={signal_at}"]  # noqa: E731

    def sweep(name):  # 2 seeds as one group, 3 iterations of 64 envs x 64 steps
        mf.main(["ewma", "--games", "breakout", "--seeds", "2", "--frames", str(3 * 4096), "--arms", "ppo_ewma",
                 "--out", str(tmp_path / name), "--run-root", str(tmp_path / name / "runs")])
        with open(tmp_path / name / "ewma_runs.csv") as f:
            return {r["seed"]: (r["final_return"], r["auc_return"], r["frames"]) for r in csv.DictReader(f)}

    def run_dir(name):
        return tmp_path / name / "runs" / "minatar-ewma" / "ppo_ewma-breakout-s0-1"

    # stopped in iteration 2, rerun with the same arguments: continued from the checkpoint of iteration 2
    # (the signal's iteration is behind it)
    monkeypatch.setattr(mf, "base_args", stopped_args)
    with pytest.raises(SystemExit) as stop:
        sweep("stopped")
    assert stop.value.code == 128 + 15 and not (tmp_path / "stopped" / "ewma_runs.csv").exists()
    assert (run_dir("stopped") / "checkpoints" / "last.ckpt").exists()
    resumes = []
    original = mf.group_resume_args
    monkeypatch.setattr(mf, "group_resume_args", lambda args, d: resumes.append(original(args, d)) or resumes[-1])
    resumed = sweep("stopped")
    assert "--ckpt_path" in resumes[-1] and len(resumed) == 2
    assert not (run_dir("stopped") / "checkpoints").exists()  # recorded: its checkpoints are gone

    # stopped, then rerun with other arguments (here: without the signal): not resumed, set aside; the
    # group then trains from the start without a stop, and the resumed one above ends bitwise as it does
    with pytest.raises(SystemExit):
        sweep("changed")
    monkeypatch.setattr(mf, "base_args", base_args)
    assert sweep("changed") == resumed
    assert "--ckpt_path" not in resumes[-1]
    assert list(run_dir("changed").parent.glob("ppo_ewma-breakout-s0-1.set-aside-*/checkpoints/last.ckpt"))
