"""The IMPALA net's 128-sample forward + backward under bf16 autocast with the weight cache off (Lightning's MixedPrecision) and on, and in fp32; interleaved rounds, CPU clock.

    python benchmarks/results/probes/bf16_autocast_cache.py THREADS
"""
import time, torch, sys
from pathlib import Path; sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from ppo_lightning.nets.models import build_network
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
obs_space = {"shape": [64, 64, 3], "dtype": "uint8", "kind": "box", "low": 0, "high": 255}
act_space = {"type": "discrete", "n": 15}
net = build_network(obs_space, act_space, {"name": "impala_cnn", "channels": [16, 32, 32], "dense": 256})
print(net.__class__.__name__)
x = torch.randint(0, 255, (128, 64, 64, 3), dtype=torch.uint8)
a = torch.randint(0, 15, (128,))
def loss_of(logits, value):
    return -torch.log_softmax(logits.float(), -1).gather(-1, a[:, None]).mean() + value.float().pow(2).mean()
def full(cache):
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=cache):
        logits, value = net(x)
        l = loss_of(logits, value)
    l.backward()
def fp32():
    logits, value = net(x); loss_of(logits, value).backward()
modes = {"autocast(all, no cache)": lambda: full(False), "autocast(all, cache)": lambda: full(True), "fp32": fp32}
for f in modes.values(): f(); f()
res = {k: [] for k in modes}
for r in range(4):
    for k, f in (modes.items() if r % 2 == 0 else reversed(list(modes.items()))):
        net.zero_grad(set_to_none=True)
        t = time.process_time(); f(); f(); res[k].append((time.process_time() - t) / 2)
for k, v in res.items():
    print(f"{k:26s} {1e3*min(v):7.1f} ms  (median {1e3*sorted(v)[len(v)//2]:.1f})")
