"""Per-sample cost of the IMPALA net's forward + backward under bf16 autocast by micro-batch size (64-512), interleaved.

    python benchmarks/results/probes/bf16_micro_batch_size.py THREADS
"""
import time, torch, sys
from pathlib import Path; sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from ppo_lightning.nets.models import build_network
torch.set_num_threads(int(sys.argv[1]))
net = build_network({"shape": [64, 64, 3], "dtype": "uint8"}, {"type": "discrete", "n": 15}, {"name": "impala_cnn", "channels": [16, 32, 32], "dense": 256})
X = torch.randint(0, 255, (512, 64, 64, 3), dtype=torch.uint8); A = torch.randint(0, 15, (512,))
def step(m):
    for i in range(0, 512, m):
        x, a = X[i:i+m], A[i:i+m]
        with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
            logits, value = net(x)
            l = -torch.log_softmax(logits.float(), -1).gather(-1, a[:, None]).mean() + value.float().pow(2).mean()
        l.backward()
sizes = [64, 128, 256, 512]
for m in sizes: step(m)
res = {m: [] for m in sizes}
for r in range(3):
    for m in (sizes if r % 2 == 0 else sizes[::-1]):
        t = time.process_time() if torch.get_num_threads() == 1 else time.perf_counter()
        step(m); res[m].append((time.process_time() if torch.get_num_threads() == 1 else time.perf_counter()) - t)
for m, v in res.items():
    print(f"micro-batch {m:4d}: {1e3*min(v)/512:.3f} ms per sample (median {1e3*sorted(v)[1]/512:.3f})")
