"""fp32 training step and no-grad forward of the IMPALA net, CPU seconds, 1 thread (which package: PYTHONPATH)."""
import json, sys, time, torch
torch.set_num_threads(1)
import ppo_lightning
from ppo_lightning.nets.impala import ImpalaActorCritic
torch.manual_seed(0)
net = ImpalaActorCritic({"shape": [64, 64, 3], "dtype": "uint8"}, {"type": "discrete", "n": 15})
obs = torch.randint(0, 256, (1024, 64, 64, 3), dtype=torch.uint8)
def step():
    for o in obs.split(128):
        logits, value = net(o)
        (logits.logsumexp(-1).mean() + value.mean()).backward()
def fwd():
    with torch.no_grad():
        net.policy(obs)
out = {"pkg": ppo_lightning.__file__}
for name, fn in (("train_1024_s", step), ("forward_1024_s", fwd)):
    fn(); best = 1e9
    for _ in range(3):
        t = time.process_time(); fn(); best = min(best, time.process_time() - t)
    out[name] = round(best, 3)
try:
    from ppo_lightning.core.hardware import resolve_trainer_precision
    out["auto"] = resolve_trainer_precision("auto", "cpu")
except ImportError:
    pass
print(json.dumps(out))
