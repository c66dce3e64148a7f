"""What ``tune`` ends with: the best settings, their interval over seeds, plots of the search
(Optuna's matplotlib visualization) and the command that trains them."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

from optuna.trial import TrialState

from ppo_lightning.run.spec import RunSpec, fit_value
from ppo_lightning.studies.analysis import MIN_SEEDS_FOR_BOOTSTRAP, interval_estimates
from ppo_lightning.tuning.runner import trial_fit
from ppo_lightning.tuning.space import Space

FRESH_SEEDS = 8
FRESH_FIRST = 1000


def seed_interval(values: list[float]) -> tuple[float, float, float, str]:
    """(mean, low, high, method) of a 95% interval of the mean over seeds: rliable's bootstrap from
    5 seeds on (the studies' rule), a t interval below (nan with one seed)."""
    vals = [v for v in values if math.isfinite(v)]
    if not vals:
        return float("nan"), float("nan"), float("nan"), "none"
    mean = sum(vals) / len(vals)
    if len(vals) >= MIN_SEEDS_FOR_BOOTSTRAP:
        import numpy as np

        est = interval_estimates({"best": np.array(vals)[:, None]})["best"]["mean"]
        return est[0], est[1], est[2], "rliable stratified bootstrap"
    if len(vals) < 2:
        return mean, float("nan"), float("nan"), "one seed: no interval"
    from scipy import stats  # start-up cost: the t quantile only for an interval

    sd = (sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) ** 0.5
    half = stats.t.ppf(0.975, len(vals) - 1) * sd / math.sqrt(len(vals))
    return mean, mean - half, mean + half, f"t interval, {len(vals)} seeds"


def search_cost(trials) -> dict:
    """What the told trials cost: CPU seconds and member-frames summed over their shares of their groups
    (``cpu_s``, ``member_frames``: `ppo_lightning.tuning.runner.train_group`); ``unrecorded``: told trials
    without them. Training a killed worker lost, and slots left idle, count in no trial."""
    told = [t for t in trials if t.state.is_finished()]
    recorded = [t for t in told if "cpu_s" in t.user_attrs]
    return {"cpu_s": sum(float(t.user_attrs["cpu_s"]) for t in recorded),
            "member_frames": sum(float(t.user_attrs.get("member_frames", 0)) for t in recorded),
            "trials": len(recorded), "unrecorded": len(told) - len(recorded)}


def train_command(space: Space, params: dict, seeds: int = FRESH_SEEDS, first: int = FRESH_FIRST) -> str:
    """``ppo-lightning fit`` with the best settings, ``seeds`` seeds the search never used (``first`` ..
    ``first + seeds - 1``), as one group: ``--seeds N`` (a group's member k has seed ``first + k``)."""
    single = RunSpec.from_settings(space.base, trial_fit(space, params), env=space.env, seed=first, frames=space.frames)
    return single.command() + (f" --seeds {seeds}" if seeds > 1 else "")


def summarize(space: Space, study, out_dir: Path, plots: bool = True) -> dict:
    """Print and write (``best.json``, ``history.png``, ``slice.png``) the search's outcome."""
    trials = study.get_trials(deepcopy=False)
    by_state = {s.name: sum(1 for t in trials if t.state == s) for s in TrialState}
    print(f"[tune] {space.name}: {by_state['COMPLETE']} complete, {by_state['PRUNED']} pruned, {by_state['RUNNING']} running, "
          f"{by_state['FAIL']} failed (of {space.trials} asked for)", flush=True)
    cost = search_cost(trials)
    if cost["trials"]:
        missing = f"; {cost['unrecorded']} told trials carry no cost record" if cost["unrecorded"] else ""
        print(f"[tune] cost: {cost['cpu_s'] / 3600:.2f} core-hours of CPU for {cost['member_frames'] / 1e6:.2f}M "
              f"member-frames ({1e3 * cost['cpu_s'] / max(cost['member_frames'], 1):.3f} ms each) over "
              f"{cost['trials']} told trials{missing}", flush=True)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    if not complete:
        print("[tune] no complete trial yet", flush=True)
        return {}
    best = max(complete, key=lambda t: t.value)
    params = {name: _decode(best.params[name]) for name in space.params if name in best.params}
    mean, low, high, method = seed_interval(list(best.user_attrs.get("seed_values", [best.value])))
    command = train_command(space, params)
    out = {"tuning": space.name, "best_trial": best.number, "params": params, "objective": best.value,
           "metric": space.metric, "score": space.score, "frames": space.frames, "seeds": list(space.seeds),
           "seed_values": best.user_attrs.get("seed_values"), "interval": [low, high], "interval_method": method,
           "command": command, "cost": cost}
    shown = ", ".join(f"{k} = {fit_value(v)}" for k, v in params.items())
    print(f"[tune] best: trial {best.number}: {shown}", flush=True)
    print(f"[tune]   {space.metric} ({space.score}) {mean:.4f}, 95% CI [{low:.4f}, {high:.4f}] over the search's seeds "
          f"{list(space.seeds)} ({method}; selected on these seeds: rerun on fresh ones to confirm)", flush=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    if plots:
        out["plots"] = plot(study, out_dir)
        print(f"[tune]   plots: {', '.join(out['plots'])}", flush=True)
    (out_dir / "best.json").write_text(json.dumps(out, indent=1))
    print(f"[tune]   train it on {FRESH_SEEDS} fresh seeds: {command}", flush=True)
    return out


def _decode(v):
    return json.loads(v) if isinstance(v, str) and v.startswith("[") else v


def plot(study, out_dir: Path) -> list[str]:
    """The objective by trial (best so far) and the objective against each parameter."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna.visualization.matplotlib as vis

    paths = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Optuna marks its matplotlib backend experimental
        for name, fn in (("history", vis.plot_optimization_history), ("slice", vis.plot_slice)):
            ax = fn(study)
            fig = (ax.flat[0] if hasattr(ax, "flat") else ax).figure
            path = out_dir / f"{name}.png"
            fig.savefig(path, dpi=100, bbox_inches="tight")
            plt.close(fig)
            paths.append(str(path))
    return paths
