"""Vectorized seeds (issue 18): seed k of a group is seed k alone; faults stay in their seed; resume."""

import lightning.pytorch as pl
import pytest
import torch
from tensordict import TensorDict

from ppo_lightning.run.builder import fit_main
from ppo_lightning.data.datamodule import RolloutDataModule
from ppo_lightning.training.module import PPOLightningModule

NET = {"name": "minatar_cnn", "channels": 4, "hidden": 16}


class KeepSource(pl.Callback):
    def on_train_end(self, trainer, pl_module):
        trainer.datamodule.kept = trainer.datamodule.source


def run(seed, num_seeds, iterations=13, callbacks=(), clip=None, accumulate=1, **model_kwargs):
    """MinAtar Breakout, 2 envs x 16 steps, 2 epochs x 2 minibatches: 4 gradient steps per iteration."""
    pl.seed_everything(seed)
    dm = RolloutDataModule(env_id="minatar:breakout", num_envs=2, rollout_steps=16, num_minibatches=2, update_epochs=2,
                           total_frames=32 * iterations, seed=seed, normalize_reward=True, num_seeds=num_seeds,
                           num_threads=1)
    model_kwargs.setdefault("network", NET)
    model = PPOLightningModule(dm.observation_space, dm.action_space, lr=3e-3, seeds=dm.seeds, **model_kwargs)
    trainer = pl.Trainer(max_epochs=-1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, callbacks=[KeepSource(), *callbacks], gradient_clip_val=clip,
                         accumulate_grad_batches=accumulate)
    trainer.fit(model, datamodule=dm)
    return model, dm, trainer


def test_seed_k_of_a_group_trains_as_seed_k_alone():
    """52 gradient steps of PPO-EWMA: each seed of a group of 3 ends within float tolerance of the same
    seed trained by a single run (the same episodes too: same actions, same games), and the seeds differ."""
    group, gdm, gtr = run(0, 3, decoupled=True, proximal_com=4.0)
    assert gtr.global_step == 52
    finals = []
    for k in range(3):
        alone, dm, _ = run(k, 1, decoupled=True, proximal_com=4.0)
        ref, got = alone.network.state_dict(), group.network.seed_state_dict(k)
        assert ref.keys() == got.keys()
        for name in ref:  # the group's convolution is a matmul, the single run's oneDNN's: float order differs
            torch.testing.assert_close(got[name], ref[name], rtol=1e-5, atol=3e-5)
        assert dm.states[0].episodes.state_dict() == gdm.kept.states[k].episodes.state_dict()
        assert dm.states[0].episodes.count > 10
        finals.append(torch.nn.utils.parameters_to_vector(alone.network.parameters()))
    assert (finals[0] - finals[1]).abs().max() > 1e-2  # independent seeds, not copies


PPG = {"n_pi": 2, "n_aux_epochs": 2, "aux_mbsize": 1, "aux_lr": 1e-3}
PPG_NET = {**NET, "arch": "dual", "aux_value_head": True}


def test_ppg_ewma_seed_k_of_a_group_trains_as_seed_k_alone():
    """PPG-EWMA (dual network, auxiliary phase every 2 iterations: 2 epochs of 1-trajectory minibatches,
    EWMA reset after it) in a group of 2: 7 iterations = 3 auxiliary phases, 28 policy and 24 auxiliary
    steps; each seed ends within float tolerance of the same seed alone, Adam states included."""
    kw = dict(network=PPG_NET, decoupled=True, proximal_com=2.0, ppg=PPG)
    group, gdm, gtr = run(0, 2, iterations=7, **kw)
    assert gtr.global_step == 7 * 4 + 3 * 2 * 2 * 2  # policy steps + aux steps (2 epochs x 2 envs x 2 rollouts)
    assert group.ppg_phases.phase == 3
    for k in range(2):
        alone, dm, atr = run(k, 1, iterations=7, **kw)
        assert atr.global_step == gtr.global_step
        ref, got = alone.network.state_dict(), group.network.seed_state_dict(k)
        for name in ref:  # float order differs (matmul vs oneDNN convolution), as in the PPO test above
            torch.testing.assert_close(got[name], ref[name], rtol=1e-5, atol=3e-5)
        for i in (0, 1):  # the policy-phase Adam and the auxiliary Adam
            ref_state, got_state = atr.optimizers[i].state_dict()["state"], gtr.optimizers[i].state_dict()["state"]
            assert ref_state.keys() == got_state.keys() and ref_state
            for j in ref_state:
                for m in ("exp_avg", "exp_avg_sq"):
                    torch.testing.assert_close(got_state[j][m][k], ref_state[j][m], rtol=1e-4, atol=1e-5)
        prox_ref = dict(alone.proximal_source.proximal.named_parameters())
        prox_got = dict(group.proximal_source.proximal.named_parameters())
        for name, v in prox_ref.items():
            torch.testing.assert_close(prox_got["inner." + name][k], v, rtol=1e-5, atol=3e-5)
        assert dm.states[0].episodes.state_dict() == gdm.kept.states[k].episodes.state_dict()


def test_adaptive_kl_keeps_one_beta_per_seed_as_each_seed_alone():
    """Adaptive KL (decoupled, EWMA anchor) in a group of 3: each seed's beta adapts on its own KL and
    equals the beta of the same seed alone after 8 iterations, weights too; the betas differ."""
    kw = dict(objective="adaptive_kl", kl_beta=1.0, kl_target=1e-4, decoupled=True, proximal_com=2.0)
    group, _, _ = run(0, 3, iterations=8, **kw)
    betas = group.loss_module.kl_beta
    assert betas.shape == (3,)
    for k in range(3):
        alone, _, _ = run(k, 1, iterations=8, **kw)
        assert float(betas[k]) == float(alone.loss_module.kl_beta)
        ref, got = alone.network.state_dict(), group.network.seed_state_dict(k)
        for name in ref:
            torch.testing.assert_close(got[name], ref[name], rtol=1e-5, atol=1e-5)
    assert len(set(betas.tolist())) == 3  # adapted apart (one may be back at its start, 1.0)


def test_gradient_clipping_clips_each_seed_by_its_own_norm():
    """With trainer.gradient_clip_val (small enough to clip every step), each seed of a group of 2 ends
    as the same seed trained alone with clipping (within float tolerance): the norm is per seed."""
    group, _, _ = run(0, 2, iterations=5, clip=0.05)
    for k in range(2):
        alone, _, _ = run(k, 1, iterations=5, clip=0.05)
        ref, got = alone.network.state_dict(), group.network.seed_state_dict(k)
        for name in ref:
            torch.testing.assert_close(got[name], ref[name], rtol=1e-5, atol=1e-5)
    unclipped, _, _ = run(0, 1, iterations=5)
    a, b = unclipped.network.state_dict(), group.network.seed_state_dict(0)
    assert any((a[n] - b[n]).abs().max() > 1e-3 for n in a)  # the clipping acted


@pytest.mark.parametrize("rows", [1, 8, 9, 32, 64])
def test_stacked_minatar_cnn_matches_each_seeds_network_with_gradients(rows):
    """The stacked MinAtar CNN (`nets.minatar_stacked`: its own linear backward, two matmul orders
    around ``SMALL_ROWS``) gives each seed's outputs and parameter gradients of its own network."""
    from ppo_lightning.nets.models import build_network
    from ppo_lightning.nets.seed_stack import SeedStack

    nets = []
    for s in range(3):
        torch.manual_seed(s)
        nets.append(build_network({"shape": [10, 10, 4], "dtype": "bool"}, {"type": "discrete", "n": 6}, NET))
    stack = SeedStack(nets)
    obs = torch.rand(3, rows, 10, 10, 4) < 0.3
    weights = torch.randn(3, rows, 7)

    def loss(logits, value, w):
        return (torch.cat([logits, value], -1) * w).sum()

    loss(*stack(obs), weights).backward()
    with torch.no_grad():
        inference = stack(obs)
    for k, net in enumerate(nets):
        logits, value = net(obs[k])
        loss(logits, value, weights[k]).backward()  # seed k's terms of the summed loss
        torch.testing.assert_close(inference[0][k], logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(inference[1][k], value, rtol=1e-5, atol=1e-5)
        for name, p in net.named_parameters():
            got = stack.inner.get_parameter(name).grad[k]
            torch.testing.assert_close(got, p.grad, rtol=1e-4, atol=1e-5, msg=name)
            assert p.grad.abs().max() > 0


@pytest.mark.parametrize("discrete, arch, aux, norm", [(False, "dual", False, True), (True, "shared", True, False),
                                                       (True, "detach", True, True), (False, "dual", True, False)])
def test_stacked_mlp_matches_each_members_network_with_gradients(discrete, arch, aux, norm):
    """The stacked MLP actor-critic (`nets.mlp_stacked`, which `SeedStack` runs instead of vmap) gives each
    member the outputs of its own network for every method, lead shape (a rollout's one row per env, a
    minibatch, none), architecture and observation normalizer (each member's own statistics), and each
    member's parameter gradients; a subclass of the network keeps vmap."""
    from ppo_lightning.nets.actor_critic import ActorCritic
    from ppo_lightning.nets.seed_stack import STACKED_FORMS, SeedStack

    action_space = {"type": "discrete", "n": 3} if discrete else {"type": "continuous", "shape": [2]}
    nets = []
    for s in range(3):
        torch.manual_seed(s)
        nets.append(ActorCritic({"shape": [5], "dtype": "float32"}, action_space, hidden_sizes=(16, 8), arch=arch,
                                aux_value_head=aux, normalize_observation=norm))
        if norm:
            nets[-1].obs_norm.update(torch.randn(40, 5) * (s + 1) + s)  # each member's own statistics
    stack = SeedStack(nets)
    assert STACKED_FORMS[type(stack.inner)] is not None
    methods = ["forward", "policy", "value"] + (["forward_aux"] if aux else [])
    for lead in [(1,), (4, 6), ()]:
        obs = torch.randn(3, *lead, 5) * 3
        for method in methods:
            with torch.no_grad():
                got = stack._call(method, obs)
            got = got if isinstance(got, tuple) else (got,)
            for k, net in enumerate(nets):
                ref = getattr(net, method)(obs[k])
                ref = ref if isinstance(ref, tuple) else (ref,)
                assert len(got) == len(ref)
                for a, b in zip(got, ref):
                    assert a[k].shape == b.shape
                    torch.testing.assert_close(a[k], b, rtol=1e-5, atol=1e-6)
    obs, weights = torch.randn(3, 32, 5), torch.randn(3, 32, 1)
    sum((out * weights).sum() for out in stack(obs)).backward()
    for k, net in enumerate(nets):
        sum((out * weights[k]).sum() for out in net(obs[k])).backward()  # member k's terms of the summed loss
        for name, p in net.named_parameters():
            if p.grad is None:
                continue
            torch.testing.assert_close(stack.inner.get_parameter(name).grad[k], p.grad, rtol=1e-4, atol=1e-6, msg=name)

    class Mine(ActorCritic):  # a subclass may change a method: it runs through vmap
        def value(self, obs):
            return super().value(obs) * 2

    torch.manual_seed(0)
    mine = SeedStack([Mine({"shape": [5], "dtype": "float32"}, action_space) for _ in range(2)])
    assert type(mine.inner) not in STACKED_FORMS
    x = torch.randn(2, 4, 5)
    for k in range(2):  # Mine.value on member k's weights (functional_call), doubled
        torch.testing.assert_close(mine.value(x)[k], mine.call_seed(k, "value", x[k]))


def test_stacked_minatar_cnn_under_bf16_autocast_casts_each_weight_once_per_region():
    """Under bf16 autocast (``bf16-mixed``) a rollout's forwards cast each stacked weight once (autocast's
    cache of leaf parameters), not once per env step, and give each seed's bf16 outputs."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from ppo_lightning.nets.models import build_network
    from ppo_lightning.nets.seed_stack import SeedStack

    nets = []
    for s in range(3):
        torch.manual_seed(s)
        nets.append(build_network({"shape": [10, 10, 4], "dtype": "bool"}, {"type": "discrete", "n": 6}, NET))
    stack = SeedStack(nets)
    dense = stack.inner.get_parameter("policy_body.dense.weight")

    class CountCasts(TorchDispatchMode):
        casts = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._to_copy.default and args[0].numel() == dense.numel():  # or a view of it
                CountCasts.casts += 1
            return func(*args, **(kwargs or {}))

    obs = torch.rand(3, 5, 1, 10, 10, 4) < 0.3  # 5 env steps of 1 env per seed
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16), CountCasts():
        outs = [stack.policy(obs[:, t])[0] for t in range(5)]
    assert CountCasts.casts == 1
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for k, net in enumerate(nets):
            for t in range(5):
                torch.testing.assert_close(outs[t][k], net.policy(obs[k, t])[0].float(), rtol=0.02, atol=0.02)


def test_batched_sampling_draws_each_seeds_multinomial():
    """`sample_per_seed` (all seeds at once) gives the actions of one ``torch.multinomial`` per seed on
    that seed's generator, and leaves every generator in the same state; bad probabilities raise."""
    from ppo_lightning.data.seed_group import sample_per_seed

    for S, n, A in [(8, 1, 6), (3, 5, 4), (2, 64, 18)]:
        for trial in range(50):
            probs = torch.distributions.Categorical(logits=3 * torch.randn(S, n, A)).probs
            g1 = [torch.Generator().manual_seed(97 * trial + k) for k in range(S)]
            g2 = [torch.Generator().manual_seed(97 * trial + k) for k in range(S)]
            ref = torch.stack([torch.multinomial(probs[k], 1, True, generator=g).T.reshape(n) for k, g in enumerate(g1)])
            assert torch.equal(sample_per_seed(probs, g2, torch.empty(S, n, A)), ref)
            assert all(torch.equal(a.get_state(), b.get_state()) for a, b in zip(g1, g2))
    probs[1, 0, 0] = float("nan")
    with pytest.raises(RuntimeError, match="nan"):
        sample_per_seed(probs, g2, torch.empty(S, n, A))


def test_stacked_reward_normalization_is_each_seeds_own():
    """`RewardNormalizer.normalize_stacked` (one time loop for S seeds) returns, and leaves in each
    normalizer, bitwise what S separate calls do, over two rollouts with episode ends."""
    from ppo_lightning.algos.advantages import RewardNormalizer

    torch.manual_seed(0)
    S, n, T = 3, 4, 16
    alone = [RewardNormalizer(n, 0.99) for _ in range(S)]
    stacked = [RewardNormalizer(n, 0.99) for _ in range(S)]
    for _ in range(2):
        reward = torch.randn(S, n, T, 1) * torch.arange(1, S + 1).reshape(S, 1, 1, 1)
        done = torch.rand(S, n, T, 1) < 0.1
        ref = torch.stack([nm(reward[k], done[k]) for k, nm in enumerate(alone)])
        got = RewardNormalizer.normalize_stacked(stacked, reward, done)
        assert torch.equal(got, ref)
        for a, b in zip(alone, stacked):
            assert torch.equal(a.ret, b.ret) and (a.count, a.mean, a.m2) == (b.count, b.mean, b.m2)
    assert len({nm.m2 for nm in stacked}) == S  # the seeds' statistics differ


class PoisonSeed(pl.Callback):
    """A NaN in seed ``seed``'s advantages at gradient step ``step`` of the run."""

    def __init__(self, seed, step):
        self.seed, self.step = seed, step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            batch["advantage"][self.seed, 0] = float("nan")


def test_nan_in_one_seed_is_skipped_for_that_seed_only():
    """Seed 1's step 5 has a NaN advantage: that step is skipped for seed 1 alone (reported per
    seed), and seeds 0 and 2 end bitwise as in the same group without the fault."""
    clean, _, _ = run(0, 3, iterations=3)
    poisoned, _, trainer = run(0, 3, iterations=3, callbacks=[PoisonSeed(1, 5)])
    assert poisoned.numerical_guard.skipped == [0, 1, 0]
    assert trainer.callback_metrics["seed1/train/skipped_steps"] == 1
    assert trainer.callback_metrics["seed0/train/skipped_steps"] == 0
    for k in (0, 2):
        a, b = clean.network.seed_state_dict(k), poisoned.network.seed_state_dict(k)
        assert all(torch.equal(a[n], b[n]) for n in a), k
    a, b = clean.network.seed_state_dict(1), poisoned.network.seed_state_dict(1)
    assert any(not torch.equal(a[n], b[n]) for n in a)
    assert all(torch.isfinite(t).all() for t in b.values())


def uninterrupted_and_resumed(base: list[str], tmp_path, frames: int) -> tuple[dict, dict]:
    """The last checkpoints of ``fit`` (``base`` arguments, checkpoints every iteration) run to ``frames``
    at once, and stopped at ``frames / 2`` then resumed to ``frames``."""
    fit_main(base + ["--data.total_frames", str(frames), "--run_dir", str(tmp_path / "ref")])
    fit_main(base + ["--data.total_frames", str(frames // 2), "--run_dir", str(tmp_path / "res")])
    fit_main(base + ["--data.total_frames", str(frames), "--run_dir", str(tmp_path / "res"),
                     "--ckpt_path", str(tmp_path / "res/checkpoints/last.ckpt")])
    return (torch.load(tmp_path / "ref/checkpoints/last.ckpt", weights_only=True),
            torch.load(tmp_path / "res/checkpoints/last.ckpt", weights_only=True))


def assert_same_training_state(a: dict, b: dict, optimizers: tuple[int, ...] = (0,)) -> None:
    """Two checkpoints hold bitwise the same weights, optimizer states and EWMA proximal weights (where
    the run has an EWMA)."""
    assert all(torch.equal(v, b["state_dict"][k]) for k, v in a["state_dict"].items())
    for opt in optimizers:
        for i, state in a["optimizer_states"][opt]["state"].items():
            assert all(torch.equal(v, b["optimizer_states"][opt]["state"][i][n]) for n, v in state.items())
    assert ("proximal_ewma" in a) == ("proximal_ewma" in b)
    if "proximal_ewma" in a:
        assert all(torch.equal(v, b["proximal_ewma"]["proximal"][k]) for k, v in a["proximal_ewma"]["proximal"].items())


def test_group_checkpoint_resumes_exactly(tmp_path):
    """A group of 2 (PPO-EWMA) stopped after 2 iterations and resumed to 4 ends bitwise as the
    uninterrupted group: weights, Adam moments, EWMA weights (envs, generators and normalizers too)."""
    base = ["fit", "--config", "ppo_lightning/configs/minatar/ppo_ewma.yaml", "--seeds", "2", "--data.num_envs", "2",
            "--data.rollout_steps", "16", "--data.num_minibatches", "2", "--data.update_epochs", "2",
            "--model.network.hidden", "16", "--data.num_threads", "1", "--mlflow.enabled", "false",
            "--video_every", "null", "--trainer.enable_progress_bar", "false", "--checkpoint_every", "1"]
    a, b = uninterrupted_and_resumed(base, tmp_path, 128)
    assert a["state_dict"]["network.inner.policy_body.conv.weight"].shape[0] == 2
    assert_same_training_state(a, b)
    group = a["RolloutDataModule"]["per_rank"][0]["resume"]["seed_group"]
    assert [s["seed"] for s in group["seeds"]] == [0, 1] and all(e["restorable"] for e in group["envs"])
    # export-hf and evaluate take one seed of the group: its weights, as a single run's network
    from ppo_lightning.interop.checkpoint_io import ExportError, load_network
    from ppo_lightning.interop.hf.loader import load_pretrained
    from ppo_lightning.interop.hf.writer import export_hf

    ckpt = tmp_path / "ref/checkpoints/last.ckpt"
    with pytest.raises(ExportError, match="group of 2 seeds .* --seed_index"):
        load_network(ckpt)
    out = export_hf(ckpt, tmp_path / "hf1", evaluate=0, seed_index=1)
    exported = load_pretrained(out).state_dict()
    net, _ = load_network(ckpt, seed_index=1)
    for name, t in net.state_dict().items():
        assert torch.equal(t, a["state_dict"]["network.inner." + name][1]) and torch.equal(exported[name], t)
    # the model card's training figures are seed 1's own episodes
    import json

    episodes = group["seeds"][1]["episodes"]
    training = json.loads((out / "config.json").read_text())["training"]
    last = episodes["returns"][-20:]
    assert training["episodes"] == episodes["count"]
    assert training["final_train_return_mean20"] == (pytest.approx(sum(last) / len(last)) if last else None)


def test_ppg_ewma_group_resumes_mid_phase_exactly(tmp_path):
    """A PPG-EWMA group of 2 stopped in the middle of a policy phase (iteration 3 of phases of 2: its
    buffer [2 seeds, envs, time] is in the checkpoint) and resumed to 6 iterations ends bitwise as the
    uninterrupted group: weights, both Adams, EWMA weights."""
    base = ["fit", "--config", "ppo_lightning/configs/minatar/ppo.yaml", "--config", "ppo_lightning/configs/minatar/ppg.yaml",
            "--config", "ppo_lightning/configs/minatar/ppg_ewma.yaml", "--seeds", "2", "--data.num_envs", "2",
            "--data.rollout_steps", "16", "--data.num_minibatches", "2", "--model.ppg.n_pi", "2",
            "--model.ppg.aux_mbsize", "1", "--model.network.hidden", "16", "--data.num_threads", "1",
            "--mlflow.enabled", "false", "--video_every", "null", "--trainer.enable_progress_bar", "false",
            "--checkpoint_every", "1", "--trainer.precision", "32-true"]
    ref = fit_main(base + ["--data.total_frames", "192", "--run_dir", str(tmp_path / "ref")])
    first = fit_main(base + ["--data.total_frames", "96", "--run_dir", str(tmp_path / "res")])
    assert first.model.ppg_phases.phase == 1 and first.model.ppg_phases.phase_iteration == 1
    fit_main(base + ["--data.total_frames", "192", "--run_dir", str(tmp_path / "res"),
                     "--ckpt_path", str(tmp_path / "res/checkpoints/last.ckpt")])
    assert ref.model.ppg_phases.phase == 3
    a = torch.load(tmp_path / "ref/checkpoints/last.ckpt", weights_only=True)
    b = torch.load(tmp_path / "res/checkpoints/last.ckpt", weights_only=True)
    assert a["state_dict"]["network.inner.policy_body.conv.weight"].shape[0] == 2
    assert_same_training_state(a, b, optimizers=(0, 1))


@pytest.mark.parametrize("data_kwargs, model_kwargs, match", [
    ({"staleness": 1}, {}, "does not support data.staleness"),
    ({"num_seeds": 0}, {}, "num_seeds must be a positive integer"),
])
def test_unsupported_group_settings_are_one_line_errors(data_kwargs, model_kwargs, match):
    with pytest.raises(ValueError, match=match):
        dm = RolloutDataModule(**{"env_id": "minatar:breakout", "num_seeds": 2, **data_kwargs})
        PPOLightningModule(dm.observation_space, dm.action_space, network=NET, seeds=[0, 1], **model_kwargs)


def test_each_seed_is_its_own_mlflow_run(tmp_path):
    """A group of 2 logs a parent run (means and seed<k>/ metrics) and one child run per seed with that
    seed's own metrics under the single-run names."""
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    fit_main(["fit", "--config", "ppo_lightning/configs/minatar/ppo.yaml", "--seeds", "2", "--data.num_envs", "2",
              "--data.rollout_steps", "16", "--data.num_minibatches", "2", "--data.update_epochs", "1",
              "--data.total_frames", "64", "--model.network.hidden", "16", "--data.num_threads", "1",
              "--mlflow.tracking_uri", uri, "--mlflow.experiment", "group", "--video_every", "null",
              "--trainer.enable_progress_bar", "false", "--run_dir", str(tmp_path / "run")])
    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("group").experiment_id])
    parent = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = {r.data.params["seed"]: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent[0].info.run_id}
    assert len(parent) == 1 and sorted(children) == ["0", "1"]
    for k, child in children.items():
        assert child.data.metrics["frames"] == 64
        assert child.data.metrics["train/loss_objective"] == parent[0].data.metrics[f"seed{k}/train/loss_objective"]


def test_log_every_frames_thins_what_the_loggers_get(tmp_path):
    """--log_every_frames 64 with iterations of 32 frames per seed: the first iteration, then every 64
    frames, and the last one reach MLflow (parent and seed runs); 0 (default): every iteration."""
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    common = ["fit", "--config", "ppo_lightning/configs/minatar/ppo.yaml", "--seeds", "2", "--data.num_envs", "2",
              "--data.rollout_steps", "16", "--data.num_minibatches", "2", "--data.update_epochs", "1",
              "--data.total_frames", "160", "--model.network.hidden", "16", "--data.num_threads", "1",
              "--mlflow.tracking_uri", uri, "--video_every", "null", "--trainer.enable_progress_bar", "false",
              "--trainer.enable_checkpointing", "false"]
    for every, expected in ((64, [32, 96, 160]), (0, [32, 64, 96, 128, 160])):
        fit_main(common + ["--log_every_frames", str(every), "--mlflow.experiment", f"every{every}",
                           "--run_dir", str(tmp_path / f"run{every}")])
        client = mlflow.MlflowClient(uri)
        runs = client.search_runs([client.get_experiment_by_name(f"every{every}").experiment_id])
        assert len(runs) == 3  # the group's run and one per seed
        for run in runs:
            assert [m.step for m in client.get_metric_history(run.info.run_id, "frames")] == expected
    with pytest.raises(ValueError, match="log_every_frames must be >= 0"):
        fit_main(common + ["--log_every_frames", "-1", "--run_dir", str(tmp_path / "bad")])


def test_a_ppg_group_member_with_its_own_lr_and_clip_range_is_its_seed_alone(tmp_path):
    """PPG-EWMA members with their own lr and clip range (one group, `MemberAdam` for the policy phase;
    the auxiliary phase's Adam at ppg.aux_lr for all): member 1 trains as seed 1 alone with its values,
    to the batched matmul's rounding (tests/test_members_every_env.py names the cause)."""
    from ppo_lightning.run import Members, RunSpec, train

    configs = [f"ppo_lightning/configs/minatar/{c}.yaml" for c in ("ppo", "ppg", "ppg_ewma")]
    spec = RunSpec.from_settings(configs, {
        "data.num_envs": 2, "data.rollout_steps": 16, "data.num_minibatches": 2, "model.ppg.n_pi": 2,
        "model.ppg.aux_mbsize": 1, "model.network.hidden": 16, "data.num_threads": 1, "mlflow.enabled": False,
        "video_every": None, "trainer.enable_progress_bar": False, "trainer.enable_checkpointing": False,
        "trainer.precision": "32-true"}, seed=0, frames=96)
    group = train(spec.with_settings({"run_dir": str(tmp_path / "g")}).replace(
        members=Members([0, 1], {"lr": [1e-3, 3e-3], "clip_eps": [0.2, 0.1]})))
    alone = train(spec.with_settings({"run_dir": str(tmp_path / "a"), "model.lr": 3e-3, "model.clip_eps": 0.1}).replace(seed=1))
    assert group.model.ppg_phases.phase == alone.model.ppg_phases.phase == 1  # an auxiliary phase ran
    ref, got = alone.model.network.state_dict(), group.model.network.seed_state_dict(1)
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], rtol=1e-5, atol=1e-5)
    other = group.model.network.seed_state_dict(0)
    assert any(not torch.allclose(other[k], ref[k]) for k in ref)  # member 0 learned otherwise


class _Stacked(torch.nn.Module):
    """Two members' parameters stacked [2, 3], as a group's network holds them."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(2, 3))


def _guard_step(guard, net, opt, grad, loss):
    opt.zero_grad()
    net.w.grad = grad.clone()
    guard.check_batch(TensorDict({"advantage": torch.zeros(2, 4)}, batch_size=[2, 4]))
    stepped = guard.after_backward(net, opt, loss)
    opt.step()
    guard.check_parameters(net, opt)
    return stepped


def test_the_guard_skips_a_step_only_when_every_member_is_bad_and_stops_when_every_member_is_lost():
    """One guard for any number of members: member 1's bad step is undone for it alone (member 0
    steps); a step bad for both is skipped (Adam's state untouched); training stops only when every
    member has had max_bad_steps in a row, naming member 0's first bad quantity."""
    from ppo_lightning.core.faults import NumericalFault, NumericalGuard

    net = _Stacked()
    net._trainer = None
    opt = torch.optim.Adam(net.parameters(), lr=0.1)
    guard = NumericalGuard(max_bad_steps=2, members=2)
    good = torch.ones(2, 3)
    assert _guard_step(guard, net, opt, good, torch.zeros(2))
    before, moments = net.w.detach().clone(), opt.state[net.w]["exp_avg"].clone()
    # member 1's gradient non-finite: member 0 steps, member 1 is put back
    assert _guard_step(guard, net, opt, torch.stack([good[0], torch.full((3,), float("nan"))]), torch.zeros(2))
    assert not torch.equal(net.w[0], before[0]) and torch.equal(net.w[1], before[1])
    assert torch.equal(opt.state[net.w]["exp_avg"][1], moments[1])
    assert guard.skipped == [0, 1] and guard.first_bad[1].startswith("non-finite gradient of 'w' of member 1")
    # both bad: the step is skipped, Adam's state as it was
    state = {k: v.clone() for k, v in opt.state[net.w].items()}
    weights = net.w.detach().clone()
    assert not _guard_step(guard, net, opt, good, torch.tensor([float("nan"), float("inf")]))
    assert torch.equal(net.w, weights) and all(torch.equal(opt.state[net.w][k], v) for k, v in state.items())
    assert guard.skipped == [1, 2] and guard.consecutive == [1, 2]
    # member 0 lost too (its second bad step in a row): every member is lost
    with pytest.raises(NumericalFault, match=r"2 consecutive optimizer steps skipped by every member .*"
                                             r"the first bad quantity: non-finite loss \(nan\) of member 0"):
        _guard_step(guard, net, opt, good, torch.tensor([float("nan"), float("nan")]))
    assert guard.metrics()["train/skipped_steps"] == (2.0, 3.0)


def test_the_guard_loads_a_single_runs_state_from_before_it_was_per_member():
    from ppo_lightning.core.faults import NumericalGuard

    guard = NumericalGuard(100)
    guard.load_state_dict({"skipped_steps": 3, "consecutive": 1, "first_bad": "non-finite loss (nan) (iteration 2, step 9)"})
    assert guard.skipped_steps == 3 and guard.consecutive == [1] and guard.first_bad[0].startswith("non-finite loss")
    assert guard.state_dict() == {"skipped": [3], "consecutive": [1], "first_bad": [guard.first_bad[0]]}


def test_a_group_with_micro_batches_and_accumulated_minibatches_trains_each_seed_as_alone():
    """The one update path splits a group's [S, B] minibatches into micro-batches on the sample
    dimension and adds up minibatches as a single run does: PPO-EWMA with 8-sample chunks of its
    16-sample minibatches and 2 minibatches per step, each seed of a group of 2 ends within float
    tolerance of the same seed alone with the same settings."""
    kw = dict(decoupled=True, proximal_com=4.0, micro_batch_size=8)
    group, _, gtr = run(0, 2, iterations=5, accumulate=2, **kw)
    assert gtr.global_step == 5 * 2  # 4 minibatches per iteration, 2 per step
    for k in range(2):
        alone, _, atr = run(k, 1, iterations=5, accumulate=2, **kw)
        assert atr.global_step == gtr.global_step
        ref, got = alone.network.state_dict(), group.network.seed_state_dict(k)
        for name in ref:  # float order differs (matmul vs oneDNN convolution), as above
            torch.testing.assert_close(got[name], ref[name], rtol=1e-5, atol=3e-5)
