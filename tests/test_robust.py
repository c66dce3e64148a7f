"""Runs that survive (issue 13): atomic checkpoints, numerical and environment faults, exact resume
after SIGKILL, data-parallel semantics."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

import robust_helpers  # noqa: F401  (registers FaultyCartPole-v0)
from ppo_lightning.interop.checkpoint_io import check_checkpoint_file
from ppo_lightning.training.checkpointing import AtomicCheckpointIO, atomic_torch_save
from ppo_lightning.data.datamodule import RolloutDataModule
from ppo_lightning.core.errors import CheckpointError, EnvFault, NumericalFault
from ppo_lightning.training.module import PPOLightningModule

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
ENV = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1",  # one thread, as this process
       "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS), os.environ.get("PYTHONPATH", "")])}


def fit(tmp_path, env_id="CartPole-v1", env_kwargs=None, total_frames=4 * 64, callbacks=(), data_kwargs=None,
        network=None, **model_kwargs):
    """Tiny PPO-EWMA run (4 envs x 16 steps, 2 x 2 minibatches; data seed 3: sub-env i has seed 3 + i)."""
    dm = RolloutDataModule(env_id=env_id, env_kwargs=env_kwargs, num_envs=4, rollout_steps=16, num_minibatches=2,
                           update_epochs=2, total_frames=total_frames, seed=3, normalize_reward=True,
                           **(data_kwargs or {}))
    model_kwargs = {"decoupled": True, "proximal_com": 4.0, "objective": "adaptive_kl", **model_kwargs}
    if model_kwargs["objective"] == "adaptive_kl":  # its target (another objective ignores it: refused)
        model_kwargs.setdefault("kl_target", 1e-3)
    model = PPOLightningModule(dm.observation_space, dm.action_space,
                               network=network or {"name": "mlp", "hidden_sizes": [16]}, **model_kwargs)
    ckpt = pl.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_epochs=1, save_top_k=-1, save_last=True,
                                        save_on_train_epoch_end=True)
    trainer = pl.Trainer(max_epochs=-1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[ckpt, *callbacks], plugins=[AtomicCheckpointIO()], default_root_dir=tmp_path)
    return dm, model, trainer


def finite_state(dm, model) -> None:
    """Normalizers, EWMA proximal weights and adaptive beta hold no NaN or inf."""
    import math

    assert all(math.isfinite(v) for v in (dm.states[0].reward_normalizer.mean, dm.states[0].reward_normalizer.m2,
                                           dm.states[0].advantage_moments.mean, dm.states[0].advantage_moments.var))
    assert bool(torch.isfinite(dm.states[0].reward_normalizer.ret).all())
    prox = model.proximal_source.proximal
    assert all(bool(torch.isfinite(p).all()) for p in prox.parameters())
    assert math.isfinite(float(model.loss_module.kl_beta))


# ---------------------------------------------------------------------------- atomic checkpoints


def test_kill_while_writing_keeps_the_previous_checkpoint(tmp_path):
    """SIGKILL inside torch.save (while pickling into the file): the target keeps the previous,
    complete checkpoint; the leftover temp file is removed by the next save."""
    target = tmp_path / "last.ckpt"
    atomic_torch_save({"step": 1, "w": torch.arange(5.0)}, target)
    code = ("import os, signal, torch; from ppo_lightning.training.checkpointing import atomic_torch_save\n"
            "class Die:\n    def __reduce__(self): os.kill(os.getpid(), signal.SIGKILL)\n"
            f"atomic_torch_save({{'step': 2, 'w': torch.zeros(10**6), 'x': Die()}}, {str(target)!r})")
    out = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=120)
    assert out.returncode == -signal.SIGKILL, out.stderr[-2000:]
    leftovers = list(tmp_path.glob(".last.ckpt.*.tmp"))
    assert len(leftovers) == 1  # the killed writer's temp file, never the target
    assert torch.load(target, weights_only=True)["step"] == 1
    atomic_torch_save({"step": 3}, target)
    assert not list(tmp_path.glob(".last.ckpt.*.tmp")) and torch.load(target, weights_only=True)["step"] == 3


def test_truncated_checkpoint_is_refused_in_one_line(tmp_path, capsys):
    from ppo_lightning.cli.fit import main

    good = tmp_path / "good.ckpt"
    atomic_torch_save({"w": torch.randn(1000)}, good)
    bad = tmp_path / "last.ckpt"
    bad.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        check_checkpoint_file(bad)
    with pytest.raises(CheckpointError, match="does not exist"):
        AtomicCheckpointIO().load_checkpoint(tmp_path / "missing.ckpt")
    code = main(["fit", "--config", str(ROOT / "ppo_lightning/configs/cartpole/ppo.yaml"), "--mlflow.enabled", "false",
                 "--trainer.enable_progress_bar", "false", "--run_dir", str(tmp_path / "run"), "--ckpt_path", str(bad)])
    err = capsys.readouterr().err
    assert code == 2 and f"error: checkpoint {bad} is truncated or corrupt" in err, err[-2000:]
    assert "Traceback" not in err


# ---------------------------------------------------------------------------- numerical faults


def test_nan_reward_steps_are_skipped_and_normalizers_stay_finite(tmp_path):
    """One NaN reward (sub-env 1, its 20th step: iteration 2): the minibatches holding it are
    skipped and counted, training goes on, no state absorbs the NaN."""
    dm, model, trainer = fit(tmp_path, "FaultyCartPole-v0", {"fault": "nan_reward", "after": 20, "fault_seed": 4},
                             total_frames=4 * 64, max_bad_steps=None)
    trainer.fit(model, dm)
    skipped = model.numerical_guard.skipped_steps
    assert 1 <= skipped < trainer.global_step == 4 * 4
    assert trainer.callback_metrics["train/skipped_steps"] == skipped
    finite_state(dm, model)
    assert all(bool(torch.isfinite(p).all()) for p in model.network.parameters())
    assert sum(torch.load(tmp_path / "last.ckpt", weights_only=True)["numerical_guard"]["skipped"]) == skipped


def test_ppg_ewma_skips_nan_steps_in_both_phases(tmp_path):
    """PPG steps its optimizers by hand: the same guard skips the policy-phase minibatches that hold
    the NaN reward and the auxiliary minibatches whose value targets inherited it."""
    dm, model, trainer = fit(tmp_path, "FaultyCartPole-v0", {"fault": "nan_reward", "after": 20, "fault_seed": 4},
                             total_frames=4 * 64, max_bad_steps=None, objective="clip",
                             ppg={"n_pi": 2, "n_aux_epochs": 1, "aux_mbsize": 2})
    trainer.fit(model, dm)
    assert model.ppg_phases.phase == 2  # two auxiliary phases ran
    assert model.numerical_guard.skipped_steps >= 2  # at least one policy and one auxiliary step
    assert trainer.callback_metrics["train/skipped_steps"] == model.numerical_guard.skipped_steps
    finite_state(dm, model)
    assert all(bool(torch.isfinite(p).all()) for p in model.network.parameters())


def test_consecutive_bad_steps_stop_training_naming_the_first_bad_quantity(tmp_path):
    dm, model, trainer = fit(tmp_path, "FaultyCartPole-v0", {"fault": "nan_reward", "after": 20, "fault_seed": 4},
                             max_bad_steps=2)
    with pytest.raises(NumericalFault, match=r"2 consecutive optimizer steps skipped \(model.max_bad_steps=2\); "
                                             r"the first bad quantity: non-finite minibatch input .* \(iteration 2"):
        trainer.fit(model, dm)
    finite_state(dm, model)
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["epoch"] == 0  # iteration 1's, intact


def test_nan_observation_is_an_env_fault(tmp_path):
    dm, model, trainer = fit(tmp_path, "FaultyCartPole-v0", {"fault": "nan_obs", "after": 20, "fault_seed": 5})
    with pytest.raises(EnvFault, match=r"'FaultyCartPole-v0' \(env index 2, iteration 2\) returned a non-finite observation"):
        trainer.fit(model, dm)
    finite_state(dm, model)


class ExplodeLr(pl.Callback):
    def on_train_epoch_start(self, trainer, pl_module):
        if trainer.datamodule.iteration == 1:  # the 2nd iteration starts
            for group in trainer.optimizers[0].param_groups:
                group["lr"] = 1e39


def test_exploding_learning_rate_stops_before_the_ewma_absorbs_it(tmp_path):
    dm, model, trainer = fit(tmp_path, callbacks=[ExplodeLr()])
    with pytest.raises(NumericalFault, match=r"parameter '.*' became non-finite after the optimizer step \(iteration 2, "
                                             r"step 4, lr 1e\+39\)"):
        trainer.fit(model, dm)
    finite_state(dm, model)
    assert model.proximal_source.num_updates == 4  # the EWMA never saw the bad step
    saved = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert all(bool(torch.isfinite(v).all()) for v in saved["state_dict"].values())


# ---------------------------------------------------------------------------- environment faults


@pytest.mark.parametrize("fault,message", [
    ("raise", r"raised RuntimeError in step\(\): simulator crashed"),
    ("hang", r"did not return from step\(\) within 0.5 s \(data.env_timeout_s\)"),
    ("shape", r"returned an observation of shape \(8,\) from step\(\), expected \(4,\)"),
])
def test_env_faults_name_env_index_and_iteration(tmp_path, fault, message):
    dm, model, trainer = fit(tmp_path, "FaultyCartPole-v0", {"fault": fault, "after": 20, "fault_seed": 5},
                             data_kwargs={"env_timeout_s": 0.5})
    with pytest.raises(EnvFault, match=r"environment 'FaultyCartPole-v0' \(env index 2, iteration 2\) " + message):
        trainer.fit(model, dm)
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["epoch"] == 0  # the last good checkpoint


def test_env_fault_through_the_cli_is_one_line_with_exit_code_3(tmp_path, capsys):
    from ppo_lightning.cli.fit import main

    code = main(["fit", "--config", str(ROOT / "ppo_lightning/configs/cartpole/ppo.yaml"), "--mlflow.enabled", "false",
                 "--trainer.enable_progress_bar", "false", "--run_dir", str(tmp_path), "--checkpoint_every", "1",
                 "--data.env_id", "FaultyCartPole-v0", "--data.env_kwargs", '{"fault": "raise", "after": 40, "fault_seed": 0}',
                 "--data.seed", "0",  # sub-env 0 has seed 0 (else seed_everything seeds the envs)
                 "--data.total_frames", "2048"])
    err = capsys.readouterr().err
    assert code == 3, err[-2000:]
    assert "error: environment 'FaultyCartPole-v0' (env index 0, iteration 2) raised RuntimeError" in err
    assert "Traceback" not in err
    assert torch.load(tmp_path / "checkpoints/last.ckpt", weights_only=True)["RolloutDataModule"]["iteration"] == 1


# ---------------------------------------------------------------------------- exact resume after SIGKILL

TINY = ["--mlflow.enabled", "false", "--trainer.enable_progress_bar", "false", "--checkpoint_every", "1",
        "--data.num_envs", "4", "--data.rollout_steps", "16", "--data.num_minibatches", "2", "--data.update_epochs", "2",
        "--data.normalize_reward", "true", "--data.advantage_norm_span", "4", "--data.total_frames", str(10 * 64)]
ALGORITHMS = {
    "ppo_adaptive_kl": ["--config", str(ROOT / "ppo_lightning/configs/cartpole/ppo.yaml"), "--model.objective", "adaptive_kl",
                        "--model.kl_target", "0.001"],
    "ppo_ewma": ["--config", str(ROOT / "ppo_lightning/configs/cartpole/ppo_ewma.yaml")],
    # Lightning's bf16 autocast around the rollout, the update and the EWMA proximal forward
    "ppo_ewma_bf16": ["--config", str(ROOT / "ppo_lightning/configs/cartpole/ppo_ewma.yaml"), "--trainer.precision", "bf16-mixed"],
    # n_pi 3 over 10 iterations: kills in the middle of a policy phase (its buffer is in the checkpoint)
    "ppg_ewma": ["--config", str(ROOT / "ppo_lightning/configs/cartpole/ppg_ewma.yaml"), "--model.ppg.n_pi", "3"],
    # a vectorized group of 2 seeds (issue 18) on MinAtar, whose env state is in the checkpoint
    "ppo_ewma_seed_group": ["--config", str(ROOT / "ppo_lightning/configs/minatar/ppo_ewma.yaml"), "--seeds", "2",
                            "--model.network.hidden", "16", "--data.num_threads", "1"],
}
# (phase, iteration, extra): SIGKILL inside an env step of the collection, after an optimizer step,
# while writing last.ckpt. Every resume continues from <run>/checkpoints/last.ckpt, in the same folder.
KILLS = {
    "ppo_adaptive_kl": [("update", 5, {"step": 3})],
    "ppo_ewma": [("collect", 4, {}), ("update", 6, {"step": 2}), ("checkpoint", 8, {"write": 2})],
    "ppo_ewma_bf16": [("collect", 4, {}), ("update", 6, {"step": 2})],
    "ppg_ewma": [("update", 5, {"step": 3}), ("checkpoint", 8, {"write": 2})],
    "ppo_ewma_seed_group": [("update", 5, {"step": 3}), ("checkpoint", 8, {"write": 2})],
}


def final_state(path):
    ckpt = torch.load(path, weights_only=True)
    optimizers = {f"{i}/{k}": v for i, o in enumerate(ckpt["optimizer_states"]) for k, v in o["state"].items()}
    return ckpt["state_dict"], optimizers, ckpt.get("proximal_ewma")


def fit_and_resume(tmp_path, env_id, env_kwargs=None, network=None, iterations=3, resume_after=1):
    """Network parameters of an uninterrupted run and of one resumed from its checkpoint after
    ``resume_after`` iterations (in process; the SIGKILL test below covers real kills)."""
    out = []
    for name, frames, ckpt in (("a", iterations, None), ("b", resume_after, None),
                               ("c", iterations, "b/last.ckpt")):
        pl.seed_everything(0)
        dm, model, trainer = fit(tmp_path / name, env_id, env_kwargs, total_frames=frames * 64, network=network,
                                 data_kwargs={"num_threads": 1})
        trainer.fit(model, dm, ckpt_path=None if ckpt is None else tmp_path / ckpt)
        out.append((dm, {k: v.clone() for k, v in model.network.state_dict().items()}))
    return out[0], out[2]


def test_procgen_env_state_resumes_exactly(tmp_path):
    """Procgen games restored with get_state/set_state: the resumed run is bitwise the uninterrupted one."""
    (dm_a, ref), (dm_c, got) = fit_and_resume(tmp_path, "procgen:coinrun", {"distribution_mode": "easy"},
                                              {"name": "impala_cnn", "channels": [4, 8], "dense": 16})
    assert all(torch.equal(ref[k], got[k]) for k in ref)


def test_mujoco_env_state_resumes_exactly(tmp_path):
    """Hopper restored from its MjData's integration state (``mj_getState``) with every wrapper's state:
    the run resumed after one iteration, mid-episode, is bitwise the uninterrupted one; and with the
    wrappers' state alone (the simulation where a fresh env left it) it is not."""
    pytest.importorskip("mujoco")
    from ppo_lightning.data import resume_state

    (dm_a, ref), (dm_c, got) = fit_and_resume(tmp_path / "exact", "Hopper-v5", iterations=3)
    assert all(torch.equal(ref[k], got[k]) for k in ref)
    saved = torch.load(tmp_path / "exact/b/last.ckpt", weights_only=True)["RolloutDataModule"]["per_rank"][0]
    assert saved["resume"]["env"]["restorable"] is True
    original = resume_state._mujoco_kind
    try:  # the control: the simulation's state not saved (the wrappers' still are): the resumed run differs
        resume_state._mujoco_kind = lambda value: "static" if original(value) else None
        (_, ref2), (_, got2) = fit_and_resume(tmp_path / "restart", "Hopper-v5", iterations=3)
    finally:
        resume_state._mujoco_kind = original
    assert all(torch.equal(ref[k], ref2[k]) for k in ref) and any(not torch.equal(ref2[k], got2[k]) for k in ref2)


def test_procgen_state_round_trip_through_a_checkpoint_continues_exactly():
    """A game saved mid-episode, written with torch.save and loaded with weights_only into a fresh env
    (of another seed), then driven by the same actions for 500 steps: the same observations, rewards
    and episode ends (episodes end and restart on the way)."""
    import io

    import numpy as np

    from ppo_lightning.envs.procgen_env import ProcgenTorchEnv

    def drive(env, actions):
        out = []
        for a in actions:
            env._venv.act(a)
            rew, ob, first = env._venv.observe()
            out.append((ob["rgb"].copy(), rew.copy(), first.copy()))
        return [np.stack(x) for x in zip(*out)]

    rng = np.random.default_rng(0)
    env = ProcgenTorchEnv("coinrun", 4, seed=1)
    drive(env, rng.integers(0, 15, (300, 4)).astype(np.int32))
    buf = io.BytesIO()
    torch.save(env.get_state(), buf)
    actions = rng.integers(0, 15, (500, 4)).astype(np.int32)
    expected = drive(env, actions)
    other = ProcgenTorchEnv("coinrun", 4, seed=7)
    other.set_state(torch.load(io.BytesIO(buf.getvalue()), weights_only=True))
    got = drive(other, actions)
    assert expected[2].sum() > 0  # some episodes ended
    assert all(np.array_equal(e, g) for e, g in zip(expected, got))


class Unpicklable:
    """Env state that is not plain data (as a Box2D world or MuJoCo's MjData)."""


class OpaqueCartPole(robust_helpers.CartPoleEnv):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.world = Unpicklable()


def test_env_that_cannot_be_restored_warns_and_restarts_its_episodes(tmp_path):
    """The bounded difference: a warning naming the state; the envs restart (the first rollout
    after the resume begins new episodes in every env); frames, iterations and every other piece of
    state resume as saved."""
    import gymnasium as gym

    if "OpaqueCartPole-v0" not in gym.registry:
        gym.register("OpaqueCartPole-v0", entry_point=OpaqueCartPole, max_episode_steps=500)
    saved = torch.load  # the run below checks the checkpoint says so too
    with pytest.warns(UserWarning, match=r"state of 'OpaqueCartPole-v0' cannot be restored exactly .*"
                                         r"OpaqueCartPole.world \(Unpicklable\).* the environments restart"):
        (dm_a, ref), (dm_c, got) = fit_and_resume(tmp_path, "OpaqueCartPole-v0")
    ckpt = saved(tmp_path / "b/last.ckpt", weights_only=True)["RolloutDataModule"]["per_rank"][0]
    assert ckpt["resume"]["env"]["restorable"] is False
    assert dm_c.frames == dm_a.frames and dm_c.iteration == dm_a.iteration
    assert any(not torch.equal(ref[k], got[k]) for k in ref)  # not exact, as the warning says


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_sigkill_and_resume_gives_bitwise_the_same_parameters(tmp_path, algorithm):
    """Killed with SIGKILL during collection / an update / a checkpoint write and resumed from last.ckpt,
    the run ends with bitwise the same network, optimizer and EWMA state as the uninterrupted one."""
    from ppo_lightning.run.builder import fit_main

    args = ["fit", *ALGORITHMS[algorithm], *TINY]
    fit_main([*args, "--run_dir", str(tmp_path / "reference")])  # in process: same code, one thread
    run, ckpt = tmp_path / "killed", tmp_path / "killed/checkpoints/last.ckpt"
    for i, (phase, iteration, extra) in enumerate(KILLS[algorithm]):
        killer = {"class_path": "robust_helpers.KillAt", "init_args": {"phase": phase, "iteration": iteration, **extra}}
        resume = ["--ckpt_path", str(ckpt)] if i else []
        out = subprocess.run([sys.executable, "-m", "ppo_lightning.cli.main", *args, "--run_dir", str(run), *resume,
                              f"--trainer.callbacks+={killer}".replace("'", '"')],
                             env=ENV, capture_output=True, text=True, timeout=600)
        assert out.returncode == -signal.SIGKILL, out.stderr[-3000:]
        assert torch.load(ckpt, weights_only=True)["RolloutDataModule"]["iteration"] == iteration - 1
    if KILLS[algorithm][-1][0] == "checkpoint":
        assert list((run / "checkpoints").glob(".last.ckpt.*.tmp"))  # the kill did hit the write
    out = subprocess.run([sys.executable, "-m", "ppo_lightning.cli.main", *args, "--run_dir", str(run), "--ckpt_path", str(ckpt)],
                         env=ENV, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    ref, got = final_state(tmp_path / "reference/checkpoints/last.ckpt"), final_state(ckpt)
    assert ref[0].keys() == got[0].keys() and all(torch.equal(ref[0][k], got[0][k]) for k in ref[0])
    for k, state in ref[1].items():
        assert all(torch.equal(v, got[1][k][name]) for name, v in state.items())
    if ref[2] is not None:
        assert ref[2]["weight"] == got[2]["weight"]
        assert all(torch.equal(v, got[2]["proximal"][k]) for k, v in ref[2]["proximal"].items())


# ---------------------------------------------------------------------------- gradient accumulation


@pytest.mark.parametrize("micro", [None, 5])
def test_accumulate_grad_batches_equals_the_union_minibatch(micro):
    """``accumulate_grad_batches=2`` over 4 minibatches (optionally in chunks of 5) gives the update of 2
    minibatches twice the size: consecutive minibatches are slices of the same shuffle, and the chunks
    Lightning does not back-propagate itself are divided by accumulate_grad_batches as well."""
    results = []
    for num_minibatches, accumulate, micro_batch_size in ((2, 1, None), (4, 2, micro)):
        pl.seed_everything(0)
        dm = RolloutDataModule(num_envs=4, rollout_steps=16, num_minibatches=num_minibatches, update_epochs=2,
                               total_frames=128, seed=3)
        model = PPOLightningModule(dm.observation_space, dm.action_space, network={"name": "mlp", "hidden_sizes": [16]},
                                   decoupled=True, proximal_com=2.0, lr=3e-2, micro_batch_size=micro_batch_size)
        trainer = pl.Trainer(max_epochs=-1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                             enable_checkpointing=False, accumulate_grad_batches=accumulate)
        trainer.fit(model, datamodule=dm)
        assert trainer.global_step == 2 * 2 * 2  # 2 iterations x 2 epochs x 2 optimizer steps
        results.append(torch.nn.utils.parameters_to_vector(model.network.parameters()).detach())
    torch.testing.assert_close(results[1], results[0], rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------- data parallel (DDP, 2 gloo ranks)

DDP = ["--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp", "--data.num_threads", "1",
       "--mlflow.enabled", "false", "--trainer.enable_progress_bar", "false", "--checkpoint_every", "1",
       "--data.num_envs", "4", "--data.rollout_steps", "16", "--data.num_minibatches", "2", "--data.update_epochs", "2",
       "--data.normalize_reward", "true", "--model.objective", "adaptive_kl", "--model.kl_target", "1e-6",
       "--trainer.gradient_clip_val", "null", "--model.lr", "0.01"]


def run_ddp(tmp_path, name, *extra, frames=3 * 128):
    dump = {"class_path": "robust_helpers.DumpParams", "init_args": {"dirpath": str(tmp_path / name / "dump")}}
    out = subprocess.run([sys.executable, "-m", "ppo_lightning.cli.main", "fit", "--config",
                          str(ROOT / "ppo_lightning/configs/cartpole/ppo_ewma.yaml"), *DDP, "--data.total_frames", str(frames),
                          "--run_dir", str(tmp_path / name), f"--trainer.callbacks+={dump}".replace("'", '"'), *extra],
                         env=ENV, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return [torch.load(tmp_path / name / "dump" / f"rank{r}.pt", weights_only=True) for r in (0, 1)]


def test_ddp_two_ranks_pool_statistics_micro_batches_and_per_rank_resume(tmp_path):
    """2 gloo ranks x 4 envs, PPO-EWMA with adaptive KL and reward normalization:
    - normalization statistics, adaptive beta and logged episode counts are the same on both ranks
      (pooled), while each rank keeps its own envs and running returns;
    - micro-batches (several backward passes per step) keep the ranks identical and give the update of
      whole minibatches;
    - resuming both ranks from a mid-run checkpoint ends bitwise where the uninterrupted run ended."""
    whole = run_ddp(tmp_path, "whole")
    for rank_state in whole[1:]:
        assert all(torch.equal(v, whole[0]["params"][k]) for k, v in rank_state["params"].items())
        assert rank_state["adv"]["w"] == whole[0]["adv"]["w"] and rank_state["adv"]["s"] == whole[0]["adv"]["s"]
        assert (rank_state["reward"]["m2"], rank_state["reward"]["count"]) == (whole[0]["reward"]["m2"],
                                                                               whole[0]["reward"]["count"])
        assert not torch.equal(rank_state["reward"]["ret"], whole[0]["reward"]["ret"])  # own envs
        assert rank_state["kl_beta"] == whole[0]["kl_beta"] == 8.0  # KL far above target: doubled 3 times
        assert rank_state["episodes_logged"] == whole[0]["episodes_logged"] == sum(s["episodes_count"] for s in whole)
    assert whole[0]["adv"]["w"] == 2 * 64  # span 1: the pooled sample count of one rollout on 2 ranks
    ckpt = torch.load(tmp_path / "whole/checkpoints/iteration-00001.ckpt", weights_only=True)["RolloutDataModule"]
    assert len(ckpt["per_rank"]) == 2
    assert not torch.equal(ckpt["per_rank"][0]["resume"]["collector"]["carrier"]["observation"],
                           ckpt["per_rank"][1]["resume"]["collector"]["carrier"]["observation"])

    micro = run_ddp(tmp_path, "micro", "--model.micro_batch_size", "10")  # minibatch 32: chunks 10, 10, 10, 2
    assert all(torch.equal(v, micro[0]["params"][k]) for k, v in micro[1]["params"].items())
    for k, v in whole[0]["params"].items():
        torch.testing.assert_close(micro[0]["params"][k], v, rtol=1e-4, atol=1e-5)

    resumed = run_ddp(tmp_path, "resumed", "--ckpt_path", str(tmp_path / "whole/checkpoints/iteration-00001.ckpt"))
    for r in (0, 1):
        assert all(torch.equal(v, whole[r]["params"][k]) for k, v in resumed[r]["params"].items())
        assert resumed[r]["reward"]["ret"].equal(whole[r]["reward"]["ret"])


# ------------------------------------------------------- bad input (docs/guides/reliability.md table)


def test_bad_input_table_rows_fail_in_one_line(tmp_path, capsys):
    """The rows of the README's bad-input table added by issue 13 (the others have their own tests):
    each ends with one ``error:`` line and its exit code, never a traceback."""
    from ppo_lightning.cli.fit import main

    base = ["fit", "--config", str(ROOT / "ppo_lightning/configs/cartpole/ppo.yaml"), "--mlflow.enabled", "false",
            "--trainer.enable_progress_bar", "false", "--data.num_envs", "4", "--data.rollout_steps", "16",
            "--data.num_minibatches", "2", "--data.update_epochs", "1", "--data.total_frames", "64"]
    assert main([*base, "--run_dir", str(tmp_path / "ok")]) == 0
    good = tmp_path / "ok/checkpoints/last.ckpt"
    stale = ["--data.staleness", "1", "--data.staleness_mode", "behavior"]
    assert main([*base, *stale, "--run_dir", str(tmp_path / "stale")]) == 0
    cases = [
        (["--model.max_bad_steps", "0"], 2, "error: model.max_bad_steps must be a positive integer or null, got 0"),
        (["--data.env_timeout_s", "-1"], 2, "error: data.env_timeout_s must be a number of seconds >= 0"),
        (["--checkpoint_every", "0"], 2, "error: checkpoint_every must be a positive integer, got 0"),
        (["--ckpt_path", str(tmp_path / "missing.ckpt")], 2, f"error: checkpoint {tmp_path / 'missing.ckpt'} does not exist"),
        (["--ckpt_path", str(tmp_path)], 2, f"error: checkpoint folder {tmp_path} has no .metadata"),
        (["--ckpt_path", str(good), "--data.num_envs", "8", "--data.total_frames", "256"], 2,
         "error: the checkpoint has 4 environments per rank, the config 8 (data.num_envs)"),
        (["--ckpt_path", str(tmp_path / "stale/checkpoints/last.ckpt"), "--data.total_frames", "128", "--data.staleness", "0"], 2,
         "error: --data.staleness 0 differs from the checkpoint's 1: a resumed run keeps its settings"),
    ]
    capsys.readouterr()
    for args, code, message in cases:
        assert main([*base, "--run_dir", str(tmp_path / "bad"), *args]) == code, args
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, (args, err[-2000:])


def test_held_out_evaluation_resumes_on_the_same_episodes(tmp_path):
    """The evaluation callback's envs and carried steps are in the checkpoint: the evaluations after a
    resume report what the uninterrupted run's did (and training stays bitwise)."""
    from ppo_lightning.interop.evaluation import HeldOutEvaluation

    runs = []
    for name, frames, ckpt in (("a", 4, None), ("b", 2, None), ("c", 4, "b/last.ckpt")):
        pl.seed_everything(0)
        ev = HeldOutEvaluation(every_n_iterations=1, num_envs=3, num_steps=30, train_levels=False)
        dm, model, trainer = fit(tmp_path / name, total_frames=frames * 64, callbacks=[ev],
                                 data_kwargs={"num_threads": 1})
        trainer.fit(model, dm, ckpt_path=None if ckpt is None else tmp_path / ckpt)
        runs.append((ev.history, {k: v.clone() for k, v in model.network.state_dict().items()}))
    (hist_a, ref), _, (hist_c, got) = runs
    strip = [{k: v for k, v in h.items() if k != "time/eval_s"} for h in hist_a]
    assert [{k: v for k, v in h.items() if k != "time/eval_s"} for h in hist_c] == strip
    assert sum(h.get("eval/test/episodes", 0) for h in hist_a) >= 3  # episodes ended during evaluations
    assert all(torch.equal(ref[k], got[k]) for k in ref)


def test_module_prefixed_env_ids_register_custom_envs():
    """``module:Id`` (gymnasium's syntax) imports the module first: custom envs from the command line,
    in every DDP rank too."""
    from ppo_lightning.envs.gymnasium_env import check_gymnasium_id

    assert check_gymnasium_id("robust_helpers:FaultyCartPole-v0") == "FaultyCartPole-v0"
    with pytest.raises(ValueError, match="data.env_id: cannot import 'no_such_module'"):
        check_gymnasium_id("no_such_module:X-v0")
    with pytest.raises(ValueError, match="data.env_id: importing 'robust_helpers' did not register 'Nope-v0'"):
        check_gymnasium_id("robust_helpers:Nope-v0")


def test_a_refused_config_is_the_first_line_a_user_sees(tmp_path):
    # Lightning seeds (and says "Seed set to 1") before the CLI's checks; the line waits for them.
    out = subprocess.run([sys.executable, "-m", "ppo_lightning", "fit", "--config", "cartpole/ppo", "--model.clip_eps", "-1",
                          "--run_dir", str(tmp_path)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines() == ["error: model.clip_eps must be > 0, got -1.0"]


def test_held_log_lines_are_emitted_on_release_and_dropped_otherwise(caplog):
    import logging

    from ppo_lightning.run.builder import HeldLogLines

    log = logging.getLogger("ppo_lightning.test.held")
    with caplog.at_level(logging.INFO, logger=log.name):
        held = HeldLogLines(log.name)
        log.info("Seed set to 1")
        assert caplog.messages == []
        held.release()
        assert caplog.messages == ["Seed set to 1"]
        held = HeldLogLines(log.name)
        log.info("Seed set to 2")
        held.drop()
        log.info("after")
    assert caplog.messages == ["Seed set to 1", "after"]
