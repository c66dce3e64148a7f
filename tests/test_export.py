"""Issue 5: checkpoints to Hugging Face folders and back (``ppo-lightning export-hf``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ppo_lightning import ExportError, load_pretrained
from ppo_lightning.interop.export import export_hf, export_main

OBS = torch.tensor(
    [[0.0, 0.0, 0.0, 0.0], [0.1, -0.5, 0.05, 0.3], [-1.0, 1.0, -0.2, -1.5], [2.0, 0.3, 0.1, 0.0]]
)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A few PPO-EWMA iterations on CartPole-v1 with a real Trainer, saved as ``last.ckpt``."""
    import lightning.pytorch as pl

    from ppo_lightning.data.datamodule import RolloutDataModule
    from ppo_lightning.training.module import PPOLightningModule

    root = tmp_path_factory.mktemp("train")
    torch.manual_seed(0)
    dm = RolloutDataModule(
        env_id="CartPole-v1", num_envs=4, rollout_steps=32, num_minibatches=2, update_epochs=2,
        total_frames=4 * 32 * 3, seed=0,
    )
    model = PPOLightningModule(dm.observation_space, dm.action_space, decoupled=True, proximal_com=8.0)
    trainer = pl.Trainer(
        max_epochs=-1, logger=False, default_root_dir=root, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False,
    )
    trainer.fit(model, dm)
    ckpt = root / "last.ckpt"
    trainer.save_checkpoint(ckpt)
    model.network.eval()
    return model, ckpt


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory):
    _, ckpt = trained
    return export_hf(ckpt, tmp_path_factory.mktemp("hf") / "model")


def _outputs(net_or_model, obs=OBS):
    with torch.no_grad():
        return [t.float() for t in net_or_model(obs)]


def _assert_same_policy(expected, got, atol=0.0):
    assert len(expected) == len(got) == 2  # logits, value
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e, atol=atol, rtol=0 if atol == 0 else 1e-2)


def _no_leftovers(parent: Path, name: str) -> None:
    assert not [p.name for p in parent.iterdir() if p.name.startswith(f".{name}.")]


# ------------------------------------------------------------------------------------ round trip
def test_round_trip_automodel_and_load_pretrained(trained, exported):
    model, _ = trained
    files = sorted(p.name for p in exported.iterdir())
    assert files == [
        "README.md", "config.json", "configuration_ppo_lightning.py", "model.safetensors", "modeling_ppo_lightning.py",
        "networks_ppo_lightning.py", "replay.mp4",
    ]
    expected = _outputs(model.network)

    net = load_pretrained(exported)
    assert type(net) is type(model.network)
    _assert_same_policy(expected, _outputs(net))
    torch.testing.assert_close(net.value(OBS), expected[1], rtol=0, atol=0)

    from transformers import AutoModel

    hf = AutoModel.from_pretrained(exported, trust_remote_code=True)
    _assert_same_policy(expected, _outputs(hf))
    torch.testing.assert_close(hf.value(OBS), expected[1], rtol=0, atol=0)
    # probs go through a softmax computed two ways: equal to float rounding, not bit for bit
    torch.testing.assert_close(hf.distribution(OBS).probs, torch.softmax(expected[0], -1))
    assert hf.act(OBS, deterministic=True).tolist() == expected[0].argmax(-1).tolist()

    # Only the actor-critic's weights: no proximal copy, optimizer or loss-module state.
    weights = load_file(exported / "model.safetensors")
    assert weights.keys() == model.network.state_dict().keys()

    config = json.loads((exported / "config.json").read_text())
    assert config["model_type"] == "ppo_lightning_actor_critic"
    assert config["auto_map"]["AutoModel"] == "modeling_ppo_lightning.PPOLightningActorCritic"
    assert config["network"]["name"] == "mlp" and config["network"]["hidden_sizes"] == [64, 64]
    assert config["observation_space"] == {"shape": [4], "dtype": "float32"}
    assert config["action_space"] == {"type": "discrete", "n": 2}
    assert config["torch_dtype"] == "float32"
    assert config["environment"]["env_id"] == "CartPole-v1"
    assert config["training_frames"] == config["training"]["frames"] == 4 * 32 * 3
    assert config["algorithm"]["decoupled"] is True and config["algorithm"]["proximal_com"] == 8.0
    card = (exported / "README.md").read_text()
    assert "PPO-EWMA" in card and "CartPole-v1" in card and "load_pretrained" in card
    # the measured evaluation, as Hub model-index metadata (parsed back by huggingface_hub)
    from huggingface_hub import ModelCard

    evaluation = config["evaluation"]
    assert evaluation["episodes"] == 10 and len(evaluation["returns"]) == 10
    (result,) = ModelCard.load(exported / "README.md").data.eval_results
    assert result.dataset_name == "CartPole-v1" and result.metric_type == "mean_reward"
    assert result.metric_value == f"{evaluation['mean_return']:.2f} +/- {evaluation['std_return']:.2f}"


def test_card_has_the_runs_training_return(trained, exported):
    """The card's "Training return" is the run's last ``episode/return_mean20`` (was "unknown":
    the checkpoint keeps episodes per rank, under ``per_rank``)."""
    model, _ = trained
    dm = model.trainer.datamodule
    expected = dm.states[0].episodes.mean_return(20)  # what the run logged as episode/return_mean20
    assert dm.states[0].episodes.count > 0 and expected == expected
    training = json.loads((exported / "config.json").read_text())["training"]
    assert training["final_train_return_mean20"] == pytest.approx(expected)
    assert training["episodes"] == dm.states[0].episodes.count and training["iterations"] == dm.iteration == 3
    card = (exported / "README.md").read_text()
    assert f"Training return (mean of the last 20 training episodes, sampled actions): {expected:.2f}." in card
    assert "unknown" not in card


def test_training_return_pools_the_ranks_as_the_run_logged():
    from ppo_lightning.interop.hf.writer import _episode_count, _mean_return

    def rank(returns, count):
        return {"episodes": {"returns": returns, "lengths": [1] * len(returns), "count": count}}

    # 2 ranks: the last 20 episodes of each, pooled (pool_episode_metrics): (20 * 1 + 5 * 3) / 25
    two = {"frames": 10, "iteration": 1, "per_rank": [rank([0.0] * 10 + [1.0] * 20, 30), rank([3.0] * 5, 5)]}
    assert _mean_return(two) == pytest.approx(35 / 25) and _episode_count(two) == 35
    # a checkpoint written before the states were kept per rank
    assert _mean_return(rank([2.0, 4.0], 2)) == 3.0 and _episode_count(rank([2.0, 4.0], 2)) == 2
    # seed k of a vectorized group: select_seed puts that seed's episodes at the top level
    assert _mean_return({**two, **rank([5.0], 1)}) == 5.0 and _episode_count({**two, **rank([5.0], 1)}) == 1
    # no finished episode yet, or no data-module state: unknown
    assert _mean_return({"per_rank": [rank([], 0)]}) is None and _mean_return(None) is None
    assert _episode_count(None) is None


def test_sharded_export_writes_index(trained, tmp_path):
    model, ckpt = trained
    out = export_hf(ckpt, tmp_path / "sharded", max_shard_size="10KB")
    shards = sorted(p.name for p in out.glob("model-*.safetensors"))
    assert len(shards) > 1 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert not (out / "model.safetensors").exists()
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(model.network.state_dict())
    assert set(index["weight_map"].values()) == set(shards)
    _assert_same_policy(_outputs(model.network), _outputs(load_pretrained(out)))

    from transformers import AutoModel

    _assert_same_policy(_outputs(model.network), _outputs(AutoModel.from_pretrained(out, trust_remote_code=True)))


def _write_sharded_checkpoint(ckpt: Path, folder: Path) -> None:
    """Lay out a checkpoint like Lightning's ModelParallelStrategy.save_checkpoint, no process group."""
    import torch.distributed.checkpoint as dcp

    checkpoint = torch.load(ckpt, weights_only=True)
    converted = {"state_dict": checkpoint.pop("state_dict")}
    converted.update({f"optimizer_{i}": s for i, s in enumerate(checkpoint.pop("optimizer_states", []))})
    folder.mkdir()
    dcp.save(converted, checkpoint_id=folder, no_dist=True)
    torch.save(checkpoint, folder / "meta.pt")


def test_fsdp_sharded_checkpoint_input(trained, exported, tmp_path):
    model, ckpt = trained
    folder = tmp_path / "sharded.ckpt"
    _write_sharded_checkpoint(ckpt, folder)
    assert (folder / ".metadata").is_file() and list(folder.glob("*.distcp"))
    out = export_hf(folder, tmp_path / "from_sharded")
    assert not torch.distributed.is_initialized()
    _assert_same_policy(_outputs(model.network), _outputs(load_pretrained(out)))
    assert json.loads((out / "config.json").read_text()) == json.loads((exported / "config.json").read_text())
    a, b = load_file(out / "model.safetensors"), load_file(exported / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)




def test_damaged_sharded_checkpoint(trained, tmp_path, capsys):
    import shutil

    _, ckpt = trained
    good = tmp_path / "good.ckpt"
    _write_sharded_checkpoint(ckpt, good)
    for damage in ("shard", "metadata", "meta"):
        folder = tmp_path / f"bad_{damage}"
        shutil.copytree(good, folder)
        target = {"shard": next(folder.glob("*.distcp")), "metadata": folder / ".metadata", "meta": folder / "meta.pt"}
        data = target[damage].read_bytes()
        target[damage].write_bytes(data[: len(data) // 3])
        err = _cli_error([folder, tmp_path / "out"], capsys)
        assert "corrupt" in err, err
    no_meta = tmp_path / "no_meta"
    shutil.copytree(good, no_meta)
    (no_meta / "meta.pt").unlink()
    assert "not a sharded Lightning checkpoint" in _cli_error([no_meta, tmp_path / "out"], capsys)
    assert not (tmp_path / "out").exists()
    _no_leftovers(tmp_path, "out")


_FSDP2_WRITER = """
import os, sys, torch, torch.distributed as dist
from pathlib import Path


def run(rank, world, ckpt, out, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from ppo_lightning.nets.models import build_network

    checkpoint = torch.load(ckpt, weights_only=True)
    h = checkpoint["hyper_parameters"]
    model = torch.nn.Module()  # stands in for the LightningModule: same "network." keys
    model.network = build_network(h["observation_space"], h["action_space"], h["network"])
    model.load_state_dict(checkpoint.pop("state_dict"), strict=False)
    fully_shard(model.network, mesh=init_device_mesh("cpu", (world,)))
    # What ModelParallelStrategy.save_checkpoint writes: sharded tensors via DCP, the rest in meta.pt.
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=False, cpu_offload=True))
    assert type(state["network.policy_head.weight"]).__name__ == "DTensor"
    checkpoint.pop("optimizer_states")
    dcp.save({"state_dict": state}, checkpoint_id=out)
    if rank == 0:
        torch.save(checkpoint, Path(out) / "meta.pt")
    # Both ranks done before gloo shuts down: tearing the group down while the peer still talks to
    # it aborted a rank now and then ("terminate called without an active exception").
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)  # skip interpreter teardown, where gloo's threads can still abort the process


if __name__ == "__main__":
    import torch.multiprocessing as mp

    torch.set_num_threads(1)
    mp.spawn(run, args=(2, *sys.argv[1:3], int(sys.argv[3])), nprocs=2)
"""


def test_real_fsdp2_sharded_checkpoint(trained, exported, tmp_path):
    """Two gloo ranks shard the network with FSDP2 and save it like Lightning; read with no process group."""
    import socket
    import subprocess
    import sys

    model, ckpt = trained
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "write_fsdp2.py"
    script.write_text(_FSDP2_WRITER)
    folder = tmp_path / "fsdp2.ckpt"
    proc = subprocess.run(
        [sys.executable, str(script), str(ckpt), str(folder), str(port)], capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert {p.name for p in folder.iterdir()} == {".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt"}
    out = export_hf(folder, tmp_path / "from_fsdp2")
    _assert_same_policy(_outputs(model.network), _outputs(load_pretrained(out)))
    a, b = load_file(out / "model.safetensors"), load_file(exported / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_bfloat16_export(trained, tmp_path):
    model, ckpt = trained
    out = export_hf(ckpt, tmp_path / "bf16", dtype="bfloat16")
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert {t.dtype for t in load_file(out / "model.safetensors").values()} == {torch.bfloat16}

    stored = load_pretrained(out, dtype="auto")
    assert {p.dtype for p in stored.parameters()} == {torch.bfloat16}
    upcast = load_pretrained(out)  # float32 by default: ready to act
    for (name, p), q in zip(upcast.named_parameters(), model.network.parameters()):
        assert p.dtype == torch.float32
        torch.testing.assert_close(p, q.to(torch.bfloat16).float(), rtol=0, atol=0, msg=name)

    from transformers import AutoModel

    hf = AutoModel.from_pretrained(out, trust_remote_code=True)
    assert {p.dtype for p in hf.parameters()} == {torch.bfloat16}
    _assert_same_policy(_outputs(model.network), _outputs(hf), atol=0.05)


def test_init_from(trained, exported):
    from ppo_lightning.training.module import PPOLightningModule

    model, _ = trained
    obs_space, act_space = model.hparams.observation_space, model.hparams.action_space
    fresh = PPOLightningModule(obs_space, act_space, init_from=str(exported))
    _assert_same_policy(_outputs(model.network), _outputs(fresh.network))

    with pytest.raises(ExportError, match="shape"):
        PPOLightningModule(obs_space, act_space, network={"name": "mlp", "hidden_sizes": [32, 32]}, init_from=str(exported))
    with pytest.raises(ExportError, match="architecture differs"):
        PPOLightningModule(obs_space, act_space, network={"name": "mlp", "activation": "relu"}, init_from=str(exported))
    with pytest.raises(ExportError, match="action space"):
        PPOLightningModule(obs_space, {"type": "discrete", "n": 3}, init_from=str(exported))
    with pytest.raises(ExportError, match="not found"):
        PPOLightningModule(obs_space, act_space, init_from=str(exported.parent / "nope"))


# ------------------------------------------------------------------------------------ bad input
def _cli_error(argv, capsys) -> str:
    capsys.readouterr()  # drop earlier output (e.g. torch.distributed.checkpoint's warnings)
    assert export_main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err
    return err


def test_missing_checkpoint(tmp_path, capsys):
    out = tmp_path / "out"
    assert "does not exist" in _cli_error([tmp_path / "missing.ckpt", out], capsys)
    assert not out.exists()
    _no_leftovers(tmp_path, "out")


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_corrupt_checkpoint(trained, tmp_path, capsys, damage):
    _, ckpt = trained
    data = ckpt.read_bytes()
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes({"truncated": data[: len(data) // 2], "garbage": os.urandom(4096), "empty": b""}[damage])
    out = tmp_path / "out"
    assert "truncated or corrupt" in _cli_error([bad, out], capsys)
    assert not out.exists()
    _no_leftovers(tmp_path, "out")


def test_checkpoint_of_another_model(tmp_path, capsys):
    other = tmp_path / "other.ckpt"
    torch.save({"state_dict": {"encoder.weight": torch.ones(2, 2)}, "hyper_parameters": {"lr": 1.0}}, other)
    assert "no 'network.' weights" in _cli_error([other, tmp_path / "out"], capsys)
    no_hparams = tmp_path / "no_hparams.ckpt"
    torch.save({"state_dict": {"network.weight": torch.ones(2, 2)}, "hyper_parameters": {"lr": 1.0}}, no_hparams)
    assert "hyper_parameters lack observation_space" in _cli_error([no_hparams, tmp_path / "out"], capsys)
    plain = tmp_path / "plain.pt"
    torch.save({"weight": torch.ones(2)}, plain)
    assert "not a Lightning checkpoint" in _cli_error([plain, tmp_path / "out"], capsys)
    assert not (tmp_path / "out").exists()
    _no_leftovers(tmp_path, "out")


class _Payload:
    """Unpickling this runs code: it writes ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').close()",))


def test_pickled_payload_is_refused_not_run(trained, tmp_path, capsys):
    _, ckpt = trained
    checkpoint = torch.load(ckpt, weights_only=True)
    marker = tmp_path / "pwned"
    checkpoint["hyper_parameters"]["extra"] = _Payload(marker)
    evil = tmp_path / "evil.ckpt"
    torch.save(checkpoint, evil)
    # The payload is live: an unsafe load would run it.
    probe = tmp_path / "probe"
    torch.save(_Payload(probe), tmp_path / "probe.pt")
    torch.load(tmp_path / "probe.pt", weights_only=False)
    assert probe.exists()

    err = _cli_error([evil, tmp_path / "out"], capsys)
    assert "refusing to load" in err and "weights_only" in err
    assert not marker.exists()
    assert not (tmp_path / "out").exists()

    # The same inside a sharded checkpoint's meta.pt.
    folder = tmp_path / "evil_sharded"
    clean = torch.load(ckpt, weights_only=True)
    state = {"state_dict": clean.pop("state_dict")}
    clean.pop("optimizer_states")
    clean["hyper_parameters"]["extra"] = _Payload(marker)
    import torch.distributed.checkpoint as dcp

    folder.mkdir()
    dcp.save(state, checkpoint_id=folder, no_dist=True)
    torch.save(clean, folder / "meta.pt")
    assert "refusing to load" in _cli_error([folder, tmp_path / "out"], capsys)
    assert not marker.exists()

    # torch reads a sharded checkpoint's .metadata with a bare pickle.load: ours must not.
    torch.save(torch.load(ckpt, weights_only=True), folder / "meta.pt")
    import pickle

    (folder / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    err = _cli_error([folder, tmp_path / "out"], capsys)
    assert "refusing to load" in err and ".metadata" in err and "exec" in err
    assert not marker.exists()
    assert not (tmp_path / "out").exists()


def test_existing_output_folder(trained, tmp_path, capsys):
    model, ckpt = trained
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert "--overwrite" in _cli_error([ckpt, out], capsys)
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]

    assert export_main([str(ckpt), str(out), "--overwrite", "--max-shard-size", "20KB"]) == 0
    assert not (out / "keep.txt").exists() and (out / "model.safetensors.index.json").exists()
    _assert_same_policy(_outputs(model.network), _outputs(load_pretrained(out)))
    _no_leftovers(tmp_path, "out")

    empty = tmp_path / "empty"
    empty.mkdir()
    assert export_main([str(ckpt), str(empty)]) == 0  # an empty folder is fine


def test_failure_while_writing_leaves_nothing(trained, tmp_path, monkeypatch):
    import huggingface_hub

    _, ckpt = trained

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(huggingface_hub, "save_torch_state_dict", boom)
    with pytest.raises(OSError, match="disk full"):
        export_hf(ckpt, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_bad_options(trained, tmp_path):
    _, ckpt = trained
    with pytest.raises(ExportError, match="dtype"):
        export_hf(ckpt, tmp_path / "out", dtype="int8")
    with pytest.raises(ExportError, match="max_shard_size"):
        export_hf(ckpt, tmp_path / "out", max_shard_size="lots")
    assert not (tmp_path / "out").exists()
    not_ours = tmp_path / "not_ours"
    not_ours.mkdir()
    (not_ours / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(ExportError, match="not a ppo_lightning model"):
        load_pretrained(not_ours)


def test_cli_dispatch(trained, tmp_path):
    from ppo_lightning.cli.main import main

    _, ckpt = trained
    assert main(["export-hf", str(ckpt), str(tmp_path / "cli"), "--dtype", "float16"]) == 0
    assert json.loads((tmp_path / "cli" / "config.json").read_text())["torch_dtype"] == "float16"
