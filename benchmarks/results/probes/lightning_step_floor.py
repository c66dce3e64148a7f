"""Lightning's per-step floor: a fit whose training step is one tiny matmul, automatic optimization, Adam."""
import time, torch, warnings, logging
warnings.filterwarnings("ignore"); logging.getLogger("lightning").setLevel(logging.ERROR)
import lightning.pytorch as pl
torch.set_num_threads(1)
N = 3000
class M(pl.LightningModule):
    def __init__(self): super().__init__(); self.w = torch.nn.Parameter(torch.zeros(4, 4))
    def training_step(self, batch, i): return (batch @ self.w).sum()
    def configure_optimizers(self): return torch.optim.Adam(self.parameters(), lr=1e-3)
class DS(torch.utils.data.IterableDataset):
    def __iter__(self):
        x = torch.ones(2, 4)
        for _ in range(N): yield x
def plain():
    w = torch.nn.Parameter(torch.zeros(4, 4)); opt = torch.optim.Adam([w], lr=1e-3); x = torch.ones(2, 4)
    t = time.process_time()
    for _ in range(N):
        opt.zero_grad(); (x @ w).sum().backward(); opt.step()
    return (time.process_time() - t) / N
def lit(callbacks=0):
    cbs = [pl.Callback() for _ in range(callbacks)]
    tr = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, callbacks=cbs, accelerator="cpu")
    dl = torch.utils.data.DataLoader(DS(), batch_size=None)
    t = time.process_time(); tr.fit(M(), dl); return (time.process_time() - t) / N
plain(); lit()
for r in range(2):
    print(f"plain loop step {1e3*plain():.3f} ms; Lightning fit step {1e3*lit():.3f} ms; with 8 empty callbacks {1e3*lit(8):.3f} ms")
