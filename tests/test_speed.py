"""Issue 18's lean paths: model.compile (compiled once, no recompiles per iteration, same training)."""

import lightning.pytorch as pl
import pytest
import torch

from ppo_lightning.data.datamodule import RolloutDataModule
from ppo_lightning.training.module import PPOLightningModule


class GraphCount(pl.Callback):
    """The number of compiled graphs at the end of every iteration."""

    def __init__(self):
        self.per_iteration = []

    def on_train_epoch_end(self, trainer, pl_module):
        self.per_iteration.append(pl_module.compiled.graphs)


def train(compile, iterations=4):
    pl.seed_everything(0)
    dm = RolloutDataModule(num_envs=4, rollout_steps=16, num_minibatches=2, update_epochs=2,
                           total_frames=64 * iterations, seed=3, num_threads=1)
    model = PPOLightningModule(dm.observation_space, dm.action_space, network={"name": "mlp", "hidden_sizes": [16]},
                               decoupled=True, proximal_com=2.0, lr=3e-3, compile=compile)
    count = GraphCount()
    trainer = pl.Trainer(max_epochs=-1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, callbacks=[count] if compile else [])
    trainer.fit(model, datamodule=dm)
    return model, count.per_iteration, trainer


def test_compile_compiles_once_and_trains_like_eager():
    """aot_eager (dynamo + AOT autograd, no C++ build: the graph-capture behaviour of inductor at a
    fraction of the time): graphs are compiled in the first iteration only, the compile time is
    reported, and 4 iterations end within float tolerance of the eager run."""
    torch._dynamo.reset()
    eager, _, _ = train(False)
    compiled, graphs, trainer = train("aot_eager")
    assert graphs[0] >= 1 and graphs == [graphs[0]] * len(graphs), graphs  # no recompile after iteration 1
    assert compiled.compiled.compile_s is not None and trainer.callback_metrics["train/compiled_graphs"] == graphs[0]
    w_eager = torch.nn.utils.parameters_to_vector(eager.network.parameters())
    w_comp = torch.nn.utils.parameters_to_vector(compiled.network.parameters())
    init = torch.nn.utils.parameters_to_vector(PPOLightningModule(
        eager.hparams.observation_space, eager.hparams.action_space,
        network={"name": "mlp", "hidden_sizes": [16]}).network.parameters())
    assert (w_eager - init).abs().max() > 1e-3  # it trained
    torch.testing.assert_close(w_comp, w_eager, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("value, match", [(1, "model.compile must be"), ("no_such_backend", "unknown torch.compile backend")])
def test_compile_is_validated(value, match):
    dm = RolloutDataModule(num_envs=2, rollout_steps=8, total_frames=16)
    with pytest.raises(ValueError, match=match):
        PPOLightningModule(dm.observation_space, dm.action_space, compile=value)
