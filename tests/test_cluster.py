"""Beyond one machine (issue 20): preemption signals, faults on one rank, FSDP2 checkpoints that
survive, PPG under DDP / FSDP2, multi-node torchrun, elastic batch-size invariance."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

import cluster_helpers  # noqa: F401  (registers RankFaultyCartPole-v0)

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
ENV = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1",
       "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS), os.environ.get("PYTHONPATH", "")])}
for _k in [k for k in ENV if k.startswith("SLURM_")]:  # tests that want SLURM set it themselves
    del ENV[_k]
CLI = [sys.executable, "-m", "ppo_lightning.cli.main"]

TINY = ["--mlflow.enabled", "false", "--trainer.enable_progress_bar", "false", "--checkpoint_every", "4",
        "--data.num_envs", "4", "--data.rollout_steps", "16", "--data.num_minibatches", "2", "--data.update_epochs", "2",
        "--data.normalize_reward", "true", "--data.advantage_norm_span", "4", "--data.num_threads", "1"]
PPO_EWMA = ["fit", "--config", str(ROOT / "ppo_lightning/configs/cartpole/ppo_ewma.yaml")]


def state(path):
    """Network, optimizer and EWMA state of a checkpoint (file, or sharded folder: its meta.pt and
    the DCP shards read back without a process group)."""
    path = Path(path)
    if path.is_dir():
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        out = path.parent / (path.name + ".consolidated.pt")
        dcp_to_torch_save(path, out)
        full = torch.load(out, weights_only=True)
        meta = torch.load(path / "meta.pt", weights_only=True)
        opt = {k: v for k, v in full.items() if k.startswith("optimizer_")}
        return full["state_dict"], opt, meta.get("proximal_ewma"), meta
    ckpt = torch.load(path, weights_only=True)
    opt = {f"{i}/{k}": v for i, o in enumerate(ckpt["optimizer_states"]) for k, v in o["state"].items()}
    return ckpt["state_dict"], opt, ckpt.get("proximal_ewma"), ckpt


def _flat(obj, prefix=""):
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            out.update(_flat(v, f"{prefix}{k}/"))
        return out
    return {prefix: obj}


def assert_same_state(ref, got):
    """Bitwise the same network, optimizer state and EWMA."""
    for a, b in zip(ref[:3], got[:3]):
        fa, fb = _flat(a or {}), _flat(b or {})
        assert fa.keys() == fb.keys()
        for k, v in fa.items():
            if isinstance(v, torch.Tensor):
                assert torch.equal(v, fb[k]), k
            else:
                assert v == fb[k], k


def run(args, timeout=600, env=None, check=None):
    out = subprocess.run([*CLI, *args], env=env or ENV, capture_output=True, text=True, timeout=timeout)
    if check is not None:
        assert out.returncode == check, out.stderr[-3000:]
    return out


def callback(cls, **init_args):
    return f"--trainer.callbacks+={json.dumps({'class_path': cls, 'init_args': init_args})}"


def iteration_of(ckpt):
    ckpt = Path(ckpt)
    meta = torch.load(ckpt / "meta.pt" if ckpt.is_dir() else ckpt, weights_only=True)
    return meta["RolloutDataModule"]["iteration"]


# ---------------------------------------------------------------------------- 1. preemption signals

# (signal, phase, iteration, extra): a signal during an env step of the collection or after an
# optimizer step; each run finishes that iteration, saves last.ckpt, exits with 128 + signal.
# SIGUSR1: test_slurm_requeue_signal_requeues_and_the_restarted_job_resumes_by_itself_in_the_same_mlflow_run
SIGNALS = [("SIGTERM", "collect", 2, {}), ("SIGINT", "update", 4, {"step": 2})]


def test_signals_checkpoint_at_the_iteration_end_exit_128_plus_n_and_resume_bitwise(tmp_path):
    """SIGTERM and SIGINT sent to a real CLI process in the middle of an iteration: the
    iteration finishes, last.ckpt holds its end, one line, exit code 128 + n (never 0); resuming
    after each ends bitwise where the uninterrupted run ends (network, Adam, EWMA)."""
    args = [*PPO_EWMA, *TINY, "--data.total_frames", str(5 * 64)]
    # A subprocess as the others (OMP_NUM_THREADS=1 from the start: an in-process run of this
    # pytest process is not bitwise comparable with them)
    run([*args, "--run_dir", str(tmp_path / "reference")], check=0)
    run_dir, ckpt = tmp_path / "signalled", tmp_path / "signalled/checkpoints/last.ckpt"
    for i, (name, phase, iteration, extra) in enumerate(SIGNALS):
        resume = ["--ckpt_path", str(ckpt)] if i else []
        out = run([*args, "--run_dir", str(run_dir), *resume,
                   callback("cluster_helpers.SignalAt", signum=name, phase=phase, iteration=iteration, **extra)])
        signum = getattr(signal, name)
        assert out.returncode == 128 + signum, out.stderr[-3000:]
        assert f"received {name}: saving a checkpoint at the end of this iteration" in out.stderr
        assert (f"preempted: {name} received; stopped at the end of iteration {iteration} ({iteration * 64} frames), "
                f"checkpoint {ckpt}; exit code {128 + signum}") in out.stderr, out.stderr[-3000:]
        assert "Traceback" not in out.stderr and "finished:" not in out.stdout
        assert iteration_of(ckpt) == iteration
    out = run([*args, "--run_dir", str(run_dir), "--ckpt_path", str(ckpt)], check=0)
    assert f"checkpoint: {ckpt}\n" in out.stdout  # the same last.ckpt on (no last-v1.ckpt)
    assert_same_state(state(tmp_path / "reference/checkpoints/last.ckpt"), state(ckpt))


def test_a_signal_without_checkpointing_still_exits_128_plus_n(tmp_path):
    """trainer.enable_checkpointing false (the figure driver's runs): Lightning refuses a Checkpoint
    callback there, so SignalStop stops the run with the same line and exit code, and no checkpoint."""
    out = run([*PPO_EWMA, *TINY, "--data.total_frames", str(4 * 64), "--run_dir", str(tmp_path / "r"),
               "--trainer.enable_checkpointing", "false",
               callback("cluster_helpers.SignalAt", signum="SIGTERM", phase="collect", iteration=2)])
    assert out.returncode == 128 + signal.SIGTERM, out.stderr[-3000:]
    assert ("preempted: SIGTERM received; stopped at the end of iteration 2 (128 frames), no checkpoint "
            "(trainer.enable_checkpointing is false); exit code 143") in out.stderr, out.stderr[-3000:]
    assert not (tmp_path / "r/checkpoints/last.ckpt").exists()


# ---------------------------------------------------------------------------- 2. a fault on one rank

DDP = ["--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp"]


def running(marker: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout.splitlines()
    return [line for line in out if marker in line and "ps -eo" not in line]


def test_env_fault_on_rank_1_ends_every_rank_with_one_line_and_exit_code_3(tmp_path):
    """CartPole raising on rank 1 only (iteration 2): rank 0, waiting for it, stops too; one error
    line naming the env and the rank, exit code 3, no traceback from any rank, no process left."""
    env_id = "cluster_helpers:RankFaultyCartPole-v0"
    t0 = time.monotonic()
    out = run([*PPO_EWMA, *TINY, *DDP, "--data.total_frames", str(3 * 128), "--data.seed", "0",
               "--data.env_id", env_id, "--data.env_kwargs", '{"rank": 1, "after": 20}',
               "--run_dir", str(tmp_path / "run")], timeout=300)
    assert out.returncode == 3, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: environment '{env_id}' (env index 0, iteration 2) raised RuntimeError in "
                      "step(): simulator crashed on rank 1 (data-parallel rank 1 of 2)"], out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    assert time.monotonic() - t0 < 240
    time.sleep(2)
    assert not running(str(tmp_path / "run"))  # rank 1 ended as well


# ---------------------------------------------------------------------------- 3. FSDP2 that survives

FSDP2 = ["--trainer.accelerator", "cpu", "--trainer.devices", "2",
         "--trainer.strategy", "lightning.pytorch.strategies.ModelParallelStrategy",
         "--trainer.strategy.data_parallel_size", "2", "--trainer.strategy.tensor_parallel_size", "1"]


def test_fsdp2_sigkill_resumes_bitwise_and_sharded_checkpoints_are_never_half_written(tmp_path):
    """PPO-EWMA sharded over 2 gloo ranks (micro-batched: minibatch 32 in chunks of 24 and 8) writes
    a sharded checkpoint whose EWMA state is full and pickle-free. Killed (SIGKILL) while rank 0 writes
    last.ckpt's meta.pt: last.ckpt stays the previous complete checkpoint (the new one was being
    written to .last.ckpt.tmp); the resumed run ends bitwise where the uninterrupted one ends
    (network and Adam state read back from the shards, EWMA). A truncated shard is refused in one line.
    Exporting a sharded checkpoint: tests/test_export.py and the FSDP2 guide test."""
    from ppo_lightning.nets.models import build_network
    from ppo_lightning.interop.checkpoint_io import check_checkpoint_file

    args = [*PPO_EWMA, *TINY, *FSDP2, "--checkpoint_every", "1", "--data.total_frames", str(4 * 128),
            "--model.micro_batch_size", "24"]
    out = run([*args, "--run_dir", str(tmp_path / "reference")], check=0)
    assert out.stdout.count("finished:") == 1 and "512 frames (all ranks), 4 iterations" in out.stdout
    reference = tmp_path / "reference/checkpoints/last.ckpt"
    assert {p.name for p in reference.iterdir()} == {".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt"}
    meta = torch.load(reference / "meta.pt", weights_only=True)
    h = meta["hyper_parameters"]
    full = build_network(h["observation_space"], h["action_space"], h["network"]).state_dict()
    ewma = meta["proximal_ewma"]
    assert {k: v.shape for k, v in ewma["proximal"].items()} == {k: v.shape for k, v in full.items()}
    assert ewma["num_updates"] == meta["global_step"] == 4 * 2 * 2  # iterations x epochs x minibatches
    run_dir, ckpt = tmp_path / "killed", tmp_path / "killed/checkpoints/last.ckpt"
    # killed in the 2nd checkpoint write of iteration 3 (last.ckpt; iteration-00003.ckpt is complete)
    out = run([*args, "--run_dir", str(run_dir), callback("robust_helpers.KillAt", phase="checkpoint", iteration=3,
                                                           write=2)])
    assert out.returncode == -signal.SIGKILL, out.stderr[-3000:]
    check_checkpoint_file(ckpt)  # complete
    assert iteration_of(ckpt) == 2
    assert (run_dir / "checkpoints/.last.ckpt.tmp").is_dir()  # the kill did hit the write
    out = run([*args, "--run_dir", str(run_dir), "--ckpt_path", str(ckpt)], check=0)
    assert not (run_dir / "checkpoints/.last.ckpt.tmp").exists()
    assert_same_state(state(reference), state(ckpt))

    shard = ckpt / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    out = run([*args, "--run_dir", str(tmp_path / "bad"), "--ckpt_path", str(ckpt)], check=2)
    assert out.stderr.strip().splitlines()[-1].startswith(
        f"error: checkpoint folder {ckpt} is incomplete: shard __1_0.distcp is truncated"), out.stderr[-2000:]
    assert "Traceback" not in out.stderr


def test_close_process_group_meets_the_peers_then_destroys_the_group(tmp_path):
    """fit closes its gloo group itself after a run (a group left to interpreter teardown aborted a rank
    now and then, exit -6): two ranks, one slower to finish, both end with the group destroyed and exit 0;
    without a group it does nothing."""
    from ppo_lightning.run.builder import close_process_group

    close_process_group()  # no group: nothing to do
    script = tmp_path / "close.py"
    script.write_text(f"""
import os, sys, time
import torch.distributed as dist
from ppo_lightning.run.builder import close_process_group
rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method="file://{tmp_path / 'store'}", rank=rank, world_size=2)
time.sleep(2.0 * rank)  # rank 1 is still busy when rank 0 is done
close_process_group()
assert not dist.is_initialized()
print("closed", rank)
""")
    procs = [subprocess.Popen([sys.executable, str(script), str(r)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=ENV) for r in (0, 1)]
    outs = [p.communicate(timeout=120) for p in procs]
    for r, (p, (out, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and f"closed {r}" in out, err[-2000:]


# ---------------------------------------------------------------------------- 4. PPG under DDP and FSDP2

PPG_TINY = ["fit", "--config", str(ROOT / "ppo_lightning/configs/cartpole/ppg_ewma.yaml"), *TINY, "--checkpoint_every", "1",
            "--model.ppg.n_pi", "3", "--model.ppg.n_aux_epochs", "1", "--model.ppg.aux_mbsize", "2"]


def rank_states(tmp_path, name, *args):
    dump = callback("cluster_helpers.DumpRankState", dirpath=str(tmp_path / name / "dump"))
    run([*PPG_TINY, *args, "--run_dir", str(tmp_path / name), dump], check=0)
    return [torch.load(tmp_path / name / "dump" / f"rank{r}.pt", weights_only=True) for r in (0, 1)]


def test_ppg_ewma_under_ddp_and_fsdp2_on_two_ranks(tmp_path):
    """PPG-EWMA (n_pi 3, 5 iterations: one auxiliary phase, then two policy iterations) on 2 gloo
    ranks. DDP: the auxiliary head, unused in policy steps, does not stop DDP; both ranks end
    identical, the EWMA was reset on both after the auxiliary phase; each rank's phase buffer (its
    own rollouts) is in the checkpoint taken mid-phase, and resuming from it is bitwise exact. FSDP2:
    the same run, sharded, ends with the same parameters."""
    frames = ["--data.total_frames", str(5 * 128)]
    ddp = rank_states(tmp_path, "ddp", *DDP, *frames)
    for s in ddp:
        assert (s["phase"], s["phase_iteration"], s["resets"]) == (1, 2, 1)  # reset after the aux phase
        assert s["ewma_updates"] == 5 * 2 * 2  # policy steps only (not the auxiliary ones)
        assert all(torch.equal(v, ddp[0]["params"][k]) for k, v in s["params"].items())
        assert all(torch.equal(v, ddp[0]["proximal"][k]) for k, v in s["proximal"].items())
    mid = tmp_path / "ddp/checkpoints/iteration-00002.ckpt"  # phase iteration 2 of 3
    per_rank = torch.load(mid, weights_only=True)["RolloutDataModule"]["per_rank"]
    buffers = [r["resume"]["extra"]["ppg_buffer"] for r in per_rank]
    assert [b["phase_iteration"] for b in buffers] == [2, 2] and [len(b["rollouts"]) for b in buffers] == [2, 2]
    assert not torch.equal(buffers[0]["rollouts"][0]["data"]["observation"], buffers[1]["rollouts"][0]["data"]["observation"])
    resumed = rank_states(tmp_path, "ddp_resumed", *DDP, *frames, "--ckpt_path", str(mid))
    for r in (0, 1):
        assert all(torch.equal(v, ddp[r]["params"][k]) for k, v in resumed[r]["params"].items())
        assert all(torch.equal(v, ddp[r]["proximal"][k]) for k, v in resumed[r]["proximal"].items())

    fsdp = rank_states(tmp_path, "fsdp2", *FSDP2, *frames)
    for s in fsdp:
        assert (s["phase"], s["phase_iteration"], s["resets"]) == (1, 2, 1)
        for k, v in ddp[0]["params"].items():
            torch.testing.assert_close(s["params"][k], v, rtol=1e-4, atol=1e-6)


# ---------------------------------------------------------------------------- 5. multi-node through torchrun


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_nodes(tmp_path, name, *args, nodes=2):
    """``nodes`` torchrun processes on localhost (1 process each, static rendezvous: node i is global
    rank i), as on ``nodes`` machines; returns each rank's final state."""
    port = free_port()
    dump = callback("cluster_helpers.DumpRankState", dirpath=str(tmp_path / name / "dump"))
    procs = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes),
                               "--nproc-per-node", "1", "--node-rank", str(i), "--rdzv-backend", "static",
                               "--rdzv-endpoint", f"127.0.0.1:{port}", "-m", "ppo_lightning.cli.main", *args,
                               "--trainer.num_nodes", str(nodes), "--trainer.devices", "1",
                               "--trainer.accelerator", "cpu", "--trainer.strategy", "ddp",
                               "--run_dir", str(tmp_path / name), dump],
                              env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(nodes)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (stdout, stderr) in zip(procs, outs):
        assert p.returncode == 0, stderr[-3000:]
    assert "finished: 384 frames (all ranks), 3 iterations" in outs[0][0]
    return [torch.load(tmp_path / name / "dump" / f"rank{r}.pt", weights_only=True) for r in range(nodes)]


def test_two_nodes_by_torchrun_equal_one_node_with_two_processes_resume_and_rescale_to_one(tmp_path):
    """PPO-EWMA DDP: 2 nodes x 1 process (torchrun, TorchElasticEnvironment) ends bitwise where
    1 node x 2 processes ends (same global ranks, same env seeds), and resumes from its checkpoint
    bitwise too. The 2-rank checkpoint continued on 1 process: `check_two_ranks_to_one`."""
    args = [*PPO_EWMA, *TINY, "--checkpoint_every", "1", "--data.total_frames", str(3 * 128)]
    dump = callback("cluster_helpers.DumpRankState", dirpath=str(tmp_path / "one_node/dump"))
    run([*args, *DDP, "--run_dir", str(tmp_path / "one_node"), dump], check=0)
    one = [torch.load(tmp_path / "one_node/dump" / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    two = torchrun_nodes(tmp_path, "two_nodes", *args)
    resumed = torchrun_nodes(tmp_path, "two_nodes_resumed", *args, "--ckpt_path",
                             str(tmp_path / "two_nodes/checkpoints/iteration-00001.ckpt"))
    for r in (0, 1):
        for got in (two[r], resumed[r]):
            assert all(torch.equal(v, one[r]["params"][k]) for k, v in got["params"].items())
            assert all(torch.equal(v, one[r]["proximal"][k]) for k, v in got["proximal"].items())
    check_two_ranks_to_one(tmp_path, tmp_path / "one_node/checkpoints/last.ckpt", iterations=3)


# ---------------------------------------------------------------------------- 6. elastic batch-size invariance


def check_two_ranks_to_one(tmp_path, ckpt, iterations):
    """A PPO-EWMA checkpoint of 2 DDP ranks (``iterations`` of 128 frames) resumed on 1 process halves
    the batch (c = 2): refused in one line without --rescale; with it, the run continues with the
    scaling oracle's settings for c = 2 (lr / sqrt 2, COM x 2, advantage span x 2) in the optimizer,
    the EWMA, the advantage moments and the saved hyperparameters, prints the table and records it in
    the checkpoint."""
    from ppo_lightning.algos.scaling import batch_size_scaling

    frames = iterations * 128 + 2 * 64
    one = [*PPO_EWMA, *TINY, "--checkpoint_every", "1", "--data.total_frames", str(frames),
           "--run_dir", str(tmp_path / "one"), "--ckpt_path", str(ckpt)]
    out = run(one, check=2)
    assert out.stderr.strip().splitlines()[-1] == (
        "error: the world size changes from 2 to 1 rank(s): the batch goes from 128 to 64 frames per iteration "
        "(c = 2); resume with --rescale to apply the batch-size scaling rules, or with the checkpoint's geometry "
        "(2 rank(s) x 4 envs x 16 steps = 128 frames per iteration)")
    out = run([*one, "--rescale", "true"], check=0)
    assert "batch-size scaling: c = 2 (rules: lr, com, adv_span, ppg_n_pi)" in out.stdout
    assert "from 2 rank(s) x 4 envs x 16 steps = 128 frames per iteration" in out.stdout
    expected = batch_size_scaling(2, lr=0.002, proximal_com=24.0, adv_norm_span=4.0)
    final = torch.load(tmp_path / "one/checkpoints/last.ckpt", weights_only=True)
    assert final["RolloutDataModule"]["frames"] == frames and final["RolloutDataModule"]["iteration"] == iterations + 2
    assert final["hyper_parameters"]["lr"] == expected["lr"] == 0.002 / 2 ** 0.5
    assert all(g["lr"] == expected["lr"] for g in final["optimizer_states"][0]["param_groups"])
    assert final["hyper_parameters"]["proximal_com"] == final["proximal_ewma"]["com"] == expected["proximal_com"] == 48.0
    assert final["RolloutDataModule"]["per_rank"][0]["advantage_moments"]["span"] == expected["adv_norm_span"] == 8.0
    record = final["callbacks"]["ElasticResume"]
    assert record["history"][0]["c"] == 2 and record["history"][0]["from"]["world"] == 2
    assert record["settings"]["lr"] == expected["lr"] and record["settings"]["adv_norm_span"] == 8.0


def test_slurm_requeue_signal_requeues_and_the_restarted_job_resumes_by_itself_in_the_same_mlflow_run(tmp_path):
    """Under SLURM (its environment variables; ``scontrol`` is a stub that records its arguments, there
    is no slurmctld here): SIGUSR1 saves at the iteration's end, requeues the job and exits 138; the
    same command started again (the requeued job) finds runs/<experiment>/slurm-<job>/checkpoints/
    last.ckpt by itself and continues the same MLflow run, which ends FINISHED."""
    import mlflow

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'scontrol.log'}\n")
    (bin_dir / "scontrol").chmod(0o755)
    env = {**ENV, "PATH": f"{bin_dir}{os.pathsep}{ENV['PATH']}", "SLURM_JOB_ID": "4242", "SLURM_NTASKS": "1",
           "SLURM_JOB_NAME": "ppo-ewma", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
           "SLURM_NNODES": "1", "SLURM_NODELIST": "localhost", "SLURM_NTASKS_PER_NODE": "1"}
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = [*CLI, *PPO_EWMA, *TINY, "--mlflow.enabled", "true", "--mlflow.tracking_uri", uri, "--video_every", "null",
            "--data.total_frames", str(4 * 64)]
    first = subprocess.run([*args, callback("cluster_helpers.SignalAt", signum="SIGUSR1", phase="update", iteration=2)],
                           env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    ckpt = Path("runs/cartpole/slurm-4242/checkpoints/last.ckpt")
    assert first.returncode == 138, first.stderr[-3000:]
    assert (f"preempted: SIGUSR1 received; stopped at the end of iteration 2 (128 frames), checkpoint "
            f"{os.path.realpath(tmp_path / ckpt)}; exit code 138; requeueing SLURM job 4242") in first.stderr, \
        first.stderr[-3000:]
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", "4242"]
    second = subprocess.run(args, env={**env, "SLURM_RESTART_COUNT": "1"}, cwd=tmp_path, capture_output=True,
                            text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"SLURM job 4242 (restart 1): resuming from {ckpt}" in second.stderr
    assert "finished: 256 frames, 4 iterations" in second.stdout and "(continued)" in second.stdout
    assert f"checkpoint: {os.path.realpath(tmp_path / ckpt)}\n" in second.stdout  # not last-v1.ckpt
    runs = mlflow.MlflowClient(uri).search_runs([mlflow.MlflowClient(uri).get_experiment_by_name("cartpole").experiment_id])
    assert len(runs) == 1 and runs[0].info.run_name == "slurm-4242" and runs[0].info.status == "FINISHED"
    assert runs[0].data.tags["preempted_by"] == "SIGUSR1 at iteration 2"
    frames = [m.step for m in mlflow.MlflowClient(uri).get_metric_history(runs[0].info.run_id, "frames")]
    assert sorted(frames) == [64, 128, 192, 256]
