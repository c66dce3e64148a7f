import time, torch
torch.set_num_threads(1)
a = torch.randn(2048, 2048); a@a
best = 1e9
for _ in range(5):
    t = time.process_time(); a @ a; best = min(best, time.process_time() - t)
x = torch.randn(128, 32, 16, 16).contiguous(memory_format=torch.channels_last); w = torch.randn(32, 32, 3, 3)
import torch.nn.functional as F
with torch.no_grad():
    F.conv2d(x, w, padding=1); bc = 1e9
    for _ in range(10):
        t = time.process_time(); F.conv2d(x, w, padding=1); bc = min(bc, time.process_time() - t)
print(torch.backends.cpu.get_cpu_capability(), "matmul", round(2*2048**3/best/1e9,1), "GFLOP/s; conv 32->32 16x16", round(2*32*32*9*256*128/bc/1e9,1))
