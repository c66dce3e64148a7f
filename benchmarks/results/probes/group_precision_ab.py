"""fp32 against bf16-mixed for a seed group, alternating in one invocation (benchmarks/small_batch.py's project run,
Breakout, plain PPO): python benchmarks/results/probes/group_precision_ab.py C S ROUNDS ITERATIONS (session 12)."""
import sys, os, json
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, ROOT); sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import torch
torch.set_num_threads(1)
import small_batch as sb
c = int(sys.argv[1]); S = int(sys.argv[2]); rounds = int(sys.argv[3])
for r in range(rounds):
    for prec in ("32-true", "bf16-mixed"):
        res = sb.project_run(c, int(sys.argv[4]), 0, seeds=S, precision=prec)
        print(json.dumps({"c": c, "S": S, "round": r, "prec": prec, "fps": round(res["fps"]), "step_ms": round(res["step_ms"], 2), "env_step_ms": round(res["env_step_ms"], 2)}), flush=True)
