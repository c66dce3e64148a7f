"""Issue 36: a study is a file (validated before anything runs), its analysis comes from rliable with
TOST and Welch where rliable has none, its runner packs cells into vectorized groups over submitit
workers and resumes without redoing a finished cell."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import yaml

from ppo_lightning.studies.spec import StudyError, load_study

ROOT = Path(__file__).resolve().parents[1]
BASE = "minatar/ppo"  # a shipped config name
TINY_FIT = {"data.num_envs": 4, "data.rollout_steps": 16, "data.num_minibatches": 2, "data.update_epochs": 1,
            "trainer.precision": "32-true", "checkpoint_every": 1000000, "video_every": None, "log_every_frames": 64}


def tiny(tmp_path: Path, **over) -> Path:
    d = {"study": "tiny", "base": BASE, "fit": TINY_FIT, "envs": ["minatar:breakout"], "seeds": {"count": 1, "first": 0},
         "frames": 256, "score": "raw", "target_half_width": 0.05,
         "arms": [{"name": "ppo_ewma", "label": "PPO-EWMA", "fit": {"model.decoupled": True, "model.proximal_com": 4}},
                  {"name": "ppo_hi", "label": "PPO, lr 1e-3", "fit": {"model.lr": 0.001}}],
         "comparisons": [{"claim": "EWMA equals PPO", "a": "ppo_ewma", "b": "ppo_hi", "test": "equivalence", "margin": 1.0}]}
    d.update(over)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(d))
    return path


# ----------------------------------------------------------------------------------- study files
@pytest.mark.parametrize("change, field", [
    ({"seeds": {"count": 0}}, "seeds.count"),
    ({"seeds": {"count": 2, "frist": 1}}, "seeds.frist"),
    ({"frames": "100k"}, "frames"),
    ({"base": "experiments/minatar/nope.yaml"}, "base"),
    ({"score": "normalized"}, "score"),
    ({"pool": ["gpu"]}, "pool"),
    ({"arms": [{"name": "a", "fit": {}}]}, "arms[0].label"),
    ({"arms": [{"name": "a", "label": "A", "fit": {"model.lr": 1}}, {"name": "a", "label": "B"}]}, "arms[1].name"),
    ({"arms": [{"name": "a", "label": "A", "fit": {"lr": 1}}]}, "arms[0].fit (a).lr"),
    ({"arms": [{"name": "a", "label": "A", "fit": {"data.seed": 3}}]}, "arms[0].fit (a).data.seed"),
    ({"comparisons": [{"claim": "x", "a": "ppo_ewma", "b": "ppo"}]}, "comparisons[0].b"),
    ({"comparisons": [{"claim": "x", "a": "ppo_ewma", "b": "ppo_hi", "test": "equivalence"}]}, "comparisons[0].margin"),
    ({"comparisons": [{"claim": "x", "a": "ppo_ewma", "b": "ppo_hi", "margin": 0.1}]}, "comparisons[0].margin"),
    ({"comparisons": [{"claim": "x", "a": "ppo_ewma", "b": "ppo_hi", "metric": "iqm"}]}, "comparisons[0].metric"),
    ({"colour": "red"}, "colour"),
])
def test_a_bad_field_is_one_line_naming_it(tmp_path, change, field):
    with pytest.raises(StudyError) as err:
        load_study(tiny(tmp_path, **change))
    msg = str(err.value)
    assert "\n" not in msg and f": {field}" in msg, msg


def test_the_papers_studies_are_valid_files():
    files = sorted((ROOT / "experiments" / "studies").glob("*.yaml"))
    assert len(files) >= 10
    for f in files:
        study = load_study(f)
        assert all(arm.label for arm in study.arms.values())


# ----------------------------------------------------------------------------------- statistics
def test_tost_on_cases_with_a_known_answer():
    from scipy.stats import ttest_ind

    from ppo_lightning.studies.analysis import tost

    a = np.array([0.0, 0.1, 0.2, 0.3, 0.4])
    b = a + 0.05
    # Welch: d = -0.05, se = sqrt(2 * 0.025 / 5) = 0.1, dof 8; p = max(P(T > (d + m) / se), P(T < (d - m) / se))
    from scipy.stats import t

    for m in (0.1, 0.3, 1.0):
        expected = max(t.sf((-0.05 + m) / 0.1, 8), t.cdf((-0.05 - m) / 0.1, 8))
        assert tost(a, b, m) == pytest.approx(expected, rel=1e-12)
        # the same two one-sided tests by scipy (shifted samples)
        p1 = ttest_ind(a + m, b, equal_var=False, alternative="greater").pvalue
        p2 = ttest_ind(a - m, b, equal_var=False, alternative="less").pvalue
        assert tost(a, b, m) == pytest.approx(max(p1, p2), rel=1e-9)
    assert tost(a, b, 1.0) < 0.001      # far inside the margin: equivalent
    assert tost(a, b, 0.05) == pytest.approx(0.5)  # the difference is the margin: p = 1/2 exactly
    assert tost(a, a + 2.0, 1.0) > 0.99  # far outside


def test_noninferiority_on_cases_with_a_known_answer():
    from scipy.stats import t, ttest_ind

    from ppo_lightning.studies.analysis import noninferiority

    a = np.array([0.0, 0.1, 0.2, 0.3, 0.4])
    b = a + 0.05  # d = -0.05, se = 0.1, dof 8 (as above)
    for m in (0.02, 0.1, 0.3):
        assert noninferiority(a, b, m) == pytest.approx(t.sf((-0.05 + m) / 0.1, 8), rel=1e-12)
        assert noninferiority(a, b, m) == pytest.approx(ttest_ind(a + m, b, equal_var=False, alternative="greater").pvalue, rel=1e-9)
    assert noninferiority(a, b, 0.05) == pytest.approx(0.5)  # a is worse by exactly the margin
    assert noninferiority(a, a - 2.0, 0.01) < 1e-6            # far better: not worse, whatever the margin
    assert noninferiority(a, a + 2.0, 1.0) > 0.99              # far worse
    with pytest.raises(ValueError, match="margin"):
        noninferiority(a, b, 0.0)


def test_noninferiority_verdicts_and_its_margin_in_the_study_file(tmp_path):
    from ppo_lightning.studies.analysis import compare

    rng = np.random.default_rng(0)
    x = rng.normal(0.5, 0.02, (8, 2))
    assert "not worse than b by 0.05" in compare(x, x + 0.01, test="noninferiority", margin=0.05, target=0.05)["verdict"]
    assert "not shown within 0.05" in compare(x, x + 0.2, test="noninferiority", margin=0.05, target=0.05)["verdict"]
    bad = tmp_path / "s.yaml"
    bad.write_text("study: s\nbase: minatar/ppo\nenvs: [minatar:breakout]\nseeds: {count: 2}\nframes: 1000\n"
                   "arms:\n- {name: a, label: A, fit: {model.lr: 0.001}}\n- {name: b, label: B, fit: {model.lr: 0.002}}\n"
                   "comparisons:\n- {claim: a as good as b, a: a, b: b, test: noninferiority}\n")
    from ppo_lightning.studies.spec import StudyError, load_study

    with pytest.raises(StudyError, match=r"comparisons\[0\]\.margin: a non-inferiority test needs a positive margin"):
        load_study(bad)


def test_welch_interval_and_seed_count():
    from ppo_lightning.studies.analysis import seeds_needed, welch_diff_ci

    d, lo, hi = welch_diff_ci([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])
    assert d == 0 and lo == pytest.approx(-hi) and hi == pytest.approx(2.776445 * math.sqrt(2 / 3), rel=1e-5)
    assert seeds_needed(0.05, 0.05) == math.ceil(2 * 1.959963984540054 ** 2)


def test_rliable_difference_covers_the_truth_and_verdicts_follow_the_ci():
    from ppo_lightning.studies.analysis import compare, difference

    rng = np.random.default_rng(0)
    x, y = rng.normal(0.6, 0.02, (8, 3)), rng.normal(0.4, 0.02, (8, 3))
    d, lo, hi = difference(x, y, reps=300)
    assert difference(x, y, reps=300) == (d, lo, hi)  # the same interval every time (a report is reproducible)
    assert lo < 0.2 < hi and d == pytest.approx(x.mean() - y.mean())
    assert compare(x, y, test="difference", margin=None, target=0.05)["verdict"] == "a > b"
    out = compare(x, x + 0.001, test="equivalence", margin=0.05, target=0.05, reps=300)
    assert out["verdict"].startswith("equal within ±0.05")
    small = compare(x, x - 0.03, test="equivalence", margin=0.05, target=0.05, reps=300)  # resolved, inside the margin
    assert small["verdict"].startswith("a > b, and equal within ±0.05"), small["verdict"]


class _LoopLibrary:
    """rliable 1.2's ``get_interval_estimates`` and ``create_performance_profile`` as its source runs
    them, one replicate at a time: per replicate, per array ``np.random.choice(runs, shape)`` indexed
    with the fixed task indices (``StratifiedBootstrap`` / ``StratifiedIndependentBootstrap
    .update_indices``), the statistic called on each replicate, arch's percentile interval
    (``np.percentile`` of each column)."""

    @staticmethod
    def get_interval_estimates(data, fn, reps, random_state=None):
        points, intervals = {}, {}
        for key, arrays in data.items():
            arrays = (arrays,) if isinstance(arrays, np.ndarray) else tuple(arrays)
            strata = [np.ogrid[tuple(slice(n) for n in (0, *a.shape[1:]))][1:] for a in arrays]
            values = []
            for _ in range(reps):
                sample = [a[(np.random.choice(a.shape[0], a.shape, replace=True), *st)] for a, st in zip(arrays, strata)]
                values.append(np.asarray(fn(*sample), dtype=float))
            values = np.array(values).reshape(reps, -1)
            points[key] = fn(*arrays)
            alpha = (1.0 - 0.95) / 2  # arch's percentiles: 100 alpha and 100 (1 - alpha), not 2.5 and 97.5
            intervals[key] = np.array([np.percentile(values[:, i], [100 * alpha, 100 * (1.0 - alpha)])
                                       for i in range(values.shape[1])]).T
        return points, intervals

    @classmethod
    def create_performance_profile(cls, scores, taus, reps):
        fn = lambda s: np.array([np.mean(s.reshape(-1) > t) for t in taus])  # noqa: E731  (rliable's profile_function)
        return cls.get_interval_estimates(scores, fn, reps)


def _rliable_library():
    """``rliable.library`` where it imports, else `_LoopLibrary` (arch 7 on pandas 3)."""
    try:
        from rliable import library
    except (ImportError, TypeError):  # arch 7: pandas' deprecate_kwarg(old, new) became (klass, old, new)
        return _LoopLibrary
    return library


def test_the_vectorized_bootstrap_equals_rliables():
    """`stratified_bootstrap` evaluates rliable's replicates at once: the same points and intervals as
    rliable's get_interval_estimates and create_performance_profile, bit for bit. ``rliable.library``
    imports arch 7, which does not import on the pinned pandas 3: the reference is then rliable's
    algorithm run replicate by replicate (`_rliable_library`: its ``update_indices`` draws, arch's
    percentile interval) with rliable's own statistics (``rliable.metrics``)."""
    from rliable import metrics

    from ppo_lightning.studies import analysis as A

    library = _rliable_library()
    rng = np.random.default_rng(1)
    x, y, z = rng.normal(0.5, 0.2, (8, 3)), rng.normal(0.4, 0.2, (6, 3)), rng.normal(0.3, 0.2, (8, 3))
    curves = {"a": rng.normal(0, 1, (5, 2, 7)), "b": rng.normal(0, 1, (4, 2, 7))}

    def ref(data, fn, reps=100):
        with A._seeded(0):
            p, c = library.get_interval_estimates(data, fn, reps=reps, random_state=np.random.RandomState(0))
        return {k: (p[k], c[k][0], c[k][1]) for k in data}

    def same(a, b):
        return all(np.array_equal(np.atleast_1d(u), np.atleast_1d(v)) for u, v in zip(a, b))

    mine = A.interval_estimates({"x": x, "y": y}, reps=100)
    for k, (p, lo, hi) in ref({"x": x, "y": y}, lambda s: np.array([metrics.aggregate_mean(s), metrics.aggregate_iqm(s)])).items():
        assert mine[k]["mean"] == (p[0], lo[0], hi[0]) and mine[k]["iqm"] == (p[1], lo[1], hi[1])
    diff = lambda a, b: np.array([metrics.aggregate_mean(a) - metrics.aggregate_mean(b)])  # noqa: E731
    for other in (y, z):  # runs unequal (drawn replicate by replicate) and equal (one draw)
        assert same(A.difference(x, other, 100), ref({"d": (x, other)}, diff)["d"])
    bands = A.sample_efficiency(curves, reps=100)
    for k, r in ref(curves, lambda s: np.array([metrics.aggregate_mean(s[..., t]) for t in range(s.shape[-1])])).items():
        assert same(bands[k], r)
    taus = np.linspace(-1, 1, 9)
    with A._seeded(0):
        prof, pb = library.create_performance_profile({"x": x, "y": y}, taus, reps=100)
    mp, mb = A.performance_profiles({"x": x, "y": y}, taus, reps=100)
    assert all(np.array_equal(mp[k], prof[k]) and np.array_equal(mb[k], pb[k]) for k in "xy")


def test_report_regenerates_a_committed_500k_verdict(tmp_path):
    from ppo_lightning.studies.report import report

    study = load_study(ROOT / "experiments" / "studies" / "minatar_fig4_500k.yaml")
    text = report(study, tmp_path, plots=False)
    row = next(line for line in text.splitlines() if line.startswith("| PPO-EWMA (COM 8), lr 4e-3 differs from PPO") and "| AUC |" in line and "seaquest |" in line
               and "stratified bootstrap)" in line)
    assert "+0.033" in row and "(8 vs 8 seeds" in row  # the committed pooled AUC +0.033 [-0.007, +0.074]
    assert "bf16-mixed on Xeon-AMX" in row


# ----------------------------------------------------------------------------------- runner
def test_arms_that_differ_only_in_member_settings_pack_into_one_group(tmp_path):
    from ppo_lightning.studies import runner

    study = load_study(tiny(tmp_path, seeds={"count": 2, "first": 0}))
    groups = runner.plan(study, set(), workers=1)
    assert len(groups) == 1 and len(groups[0].members) == 4
    assert groups[0].spec.members.settings and "--data.member_hparams" in groups[0].spec.argv()
    assert len(runner.plan(study, set(), workers=2)) == 2  # split to fill the workers
    assert len(runner.plan(study, {("ppo_ewma", "minatar:breakout", 0), ("ppo_ewma", "minatar:breakout", 1)}, 1)[0].members) == 2


def test_lpt_deals_longest_first_to_the_least_loaded_worker():
    from ppo_lightning.studies.runner import lpt, makespan

    assert lpt([5, 4, 3, 3, 3], 2) == [[0, 3], [1, 2, 4]]  # 8 and 10 (LPT, not the optimum 9)
    assert makespan([5, 4, 3, 3, 3], 2) == 10
    assert lpt([1, 2], 4) == [[1], [0]] and makespan([1, 2], 1) == 3 and makespan([], 2) == 0


def test_balance_splits_a_group_only_where_the_makespan_gains_more_than_the_packing():
    from ppo_lightning.studies.runner import balance

    # the benchmark's study: 8 Breakout members, 8 SpaceInvaders members at 1.54x the cost per member
    assert balance([(8, 1.0), (8, 1.54)], 2, overhead=1.0) == [[8], [7, 1]]  # makespan 1.54 x 8 = 12.3 against 13.9
    assert balance([(8, 1.0), (8, 1.54)], 1) == [[8], [8]]  # one worker: a split only adds work
    assert balance([(8, 1.0), (8, 1.0)], 2) == [[8], [8]]  # balanced already
    assert balance([(4, 1.0)], 2, overhead=1.0) == [[2, 2]]  # 3 each against 5
    assert balance([(8, 1.0), (8, 1.54)], 2, overhead=20.0) == [[8], [8]]  # the packing lost outweighs the gain
    assert balance([(8, 1.0), (8, 1.54)], 3, overhead=1.0) == [[8], [4, 4]]  # 9 / 7.7 / 7.7 against 13.9
    assert balance([(1, 1.0)], 4) == [[1]]
    # equal groups, more workers: splitting one shortens nothing until all are split (a plateau)
    assert balance([(8, 1.0), (8, 1.0)], 4) == [[4, 4], [4, 4]]
    assert balance([(4, 1.0)] * 3, 6) == [[2, 2]] * 3


def test_plan_costs_groups_at_the_recorded_rates(tmp_path):
    """Recorded groups say Breakout costs 3x SpaceInvaders per member: the pending Breakout group is
    the one split."""
    from ppo_lightning.studies import runner
    from ppo_lightning.studies.records import Cell

    study = load_study(tiny(tmp_path, envs=["minatar:breakout", "minatar:space_invaders"], seeds={"count": 8, "first": 0}))
    per_member = {"minatar:breakout": 3.0, "minatar:space_invaders": 1.0}  # train_s of a member of an 8-member group
    done = [Cell(a, e, s, 256, 0.0, 0.0, train_s=per_member[e], group=f"{e.replace(':', '-')}-8m-0123456789", source="run")
            for a in study.arms for e in study.envs for s in range(4)]
    rates = runner.unit_rates(done, {a: "k" for a in study.arms})
    assert rates[("minatar:breakout", "k")] == pytest.approx(3.0 * 8 / (256 * (8 + runner.GROUP_OVERHEAD)))
    groups = runner.plan(study, {c.key for c in done}, 2, done)
    # Breakout 6 + 2 members: 24/9 x 7 = 18.7 s on one worker, 24/9 x 3 + 8 = 16 s on the other, against 24 s
    assert sorted((g.env, len(g.members)) for g in groups) == [("minatar:breakout", 2), ("minatar:breakout", 6),
                                                               ("minatar:space_invaders", 8)]
    assert runner.makespan([g.cost for g in groups], 2) == pytest.approx(24 / 9 * 7)
    assert sum(g.cost for g in runner.plan(study, {c.key for c in done}, 1, done)) == pytest.approx(
        (3.0 + 1.0) * 8)  # one worker: the two groups, at the recorded time per member
    # no records: the default rates, SpaceInvaders the costlier game
    fresh = runner.plan(study, set(), 2)
    assert [(g.env, len(g.members)) for g in fresh] == [("minatar:breakout", 16), ("minatar:space_invaders", 14),
                                                         ("minatar:space_invaders", 2)]


@pytest.mark.parametrize("network, obs", [({"name": "minatar_cnn", "channels": 16, "hidden": 128}, [10, 10, 6]),
                                          ({"name": "mlp", "hidden_sizes": [64, 64]}, [4])])
def test_initial_weights_do_not_depend_on_the_thread_count(network, obs):
    """The orthogonal init's QR (MKL) gives other bits in 2 threads than in 1: a network built in a
    fresh process (torch's default threads: the cores) differed from one built after an earlier run
    had set ``data.num_threads``, so a study's group differed between 1 and 2 workers."""
    import torch

    from ppo_lightning.nets.models import build_network

    weights = []
    for threads in (2, 1):
        torch.set_num_threads(threads)
        torch.manual_seed(0)
        weights.append(build_network({"shape": obs, "dtype": "float32"}, {"type": "discrete", "n": 6}, network).state_dict())
        assert torch.get_num_threads() == threads  # the caller's thread count is left as it was
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


@pytest.mark.timeout(120)
def test_a_group_trains_the_same_in_a_fresh_process_and_after_another_group(tmp_path, monkeypatch):
    """A worker trains its groups one after another in one process (`runner.run_group`): the second
    starts with the process state the first left (its ``data.num_threads``, 1), the first with a fresh
    process's (torch's default threads, here 2). Their final weights are bitwise the same."""
    import torch

    from ppo_lightning.run import train
    from ppo_lightning.studies import runner

    monkeypatch.chdir(tmp_path)
    study = load_study(tiny(tmp_path, envs=["minatar:space_invaders"]))
    group = runner.plan(study, set(), 1)[0]
    torch.set_num_threads(2)  # a fresh process on 2 cores
    fits = []
    for k in range(2):
        fits.append(train(group.spec.with_settings({"mlflow.enabled": False, "run_dir": str(tmp_path / str(k))})))
        assert torch.get_num_threads() == 1  # left by the group's data.num_threads
    a, b = (f.model.state_dict() for f in fits)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.timeout(300)
def test_packed_rows_equal_single_runs_and_a_rerun_redoes_nothing(tmp_path, monkeypatch):
    from ppo_lightning.studies import runner

    monkeypatch.chdir(tmp_path)
    study = load_study(tiny(tmp_path))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    packed = runner.plan(study, set(), workers=1)[0]
    cells = runner.run_group(study, packed, tmp_path / "packed", uri)
    for cell in cells:  # each member against its single run
        single = runner.Group(cell.env, [(cell.arm, cell.seed)], runner.cell_spec(study, cell.arm, cell.env, cell.seed))
        alone = runner.run_group(study, single, tmp_path / f"single-{cell.arm}", uri)[0]
        assert [v for _, v in cell.curve] == pytest.approx([v for _, v in alone.curve], abs=1e-6)
        assert cell.auc_return == pytest.approx(alone.auc_return, abs=1e-6)
        # the PPO paper's score, each member's own last-100-episode mean (NaN only before an episode ends)
        assert cell.last100_return == pytest.approx(alone.last100_return, abs=1e-6, nan_ok=True)
    assert any(math.isfinite(c.last100_return) for c in cells)
    # the runner, rerun on the same root: every cell is recorded, no group trains again
    stamp = {p: p.stat().st_mtime_ns for p in (tmp_path / "packed" / "cells").glob("*.json")}
    assert runner.plan(study, set(runner.done_cells(study, tmp_path / "packed")), 2) == []
    assert runner.run_study(study, workers=2, executor="local", run_root=tmp_path / "packed", tracking_uri=uri) == 0
    assert {p: p.stat().st_mtime_ns for p in stamp} == stamp
    exported = study.cells_csv.read_text().splitlines()
    assert len(exported) == 3 and "32-true" in exported[1] and exported[0].endswith(",last100_return")


@pytest.mark.timeout(600)
def test_two_local_workers_run_a_study_and_a_killed_runner_resumes(tmp_path, monkeypatch):
    """Two environments: two groups on two submitit workers (local processes). Then one cell's record
    is removed, as if the runner had been killed before it: the rerun trains only that cell's group."""
    from ppo_lightning.studies import runner

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    study = load_study(tiny(tmp_path, envs=["minatar:breakout", "minatar:space_invaders"]))
    root, uri = tmp_path / "runs", f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert runner.run_study(study, workers=2, executor="local", run_root=root, tracking_uri=uri, poll_s=1) == 0
    cells = sorted((root / "cells").glob("*.json"))
    assert len(cells) == 4
    breakout = [p for p in cells if "breakout" in p.name]
    kept = {p: p.stat().st_mtime_ns for p in cells if p not in breakout}
    for p in breakout:
        p.unlink()
    study.cells_csv.unlink()  # killed before its export
    assert [g.env for g in runner.plan(study, set(runner.done_cells(study, root)), 2)] == ["minatar:breakout"] * 2
    assert runner.run_study(study, workers=1, executor="local", run_root=root, tracking_uri=uri, poll_s=1) == 0
    assert {p: p.stat().st_mtime_ns for p in kept} == kept and len(list((root / "cells").glob("*.json"))) == 4
    assert len(study.cells_csv.read_text().splitlines()) == 5
    text = runner.status_text(study, root)
    assert "4 done, 0 running" in text and "0 pending" in text


@pytest.mark.timeout(300)
def test_study_run_envs_trains_only_those_envs_and_keeps_the_whole_studys_records(tmp_path, monkeypatch, capsys):
    """``study run --envs E``: only E's cells train (one group, one worker); the CSV export keeps the cells
    recorded before on the other env; ``status --envs`` counts the time left of E alone; an env the file
    does not have is one line, before anything trains."""
    from ppo_lightning.studies import runner
    from ppo_lightning.studies.command import main as study_main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    path = tiny(tmp_path, envs=["minatar:breakout", "minatar:space_invaders"])
    study = load_study(path)
    root = tmp_path / "runs"
    assert study_main(["run", str(path), "--envs", "minatar:asterix", "--run-root", str(root)]) == 2
    assert "minatar:asterix not among the study's envs (minatar:breakout, minatar:space_invaders)" in capsys.readouterr().out
    assert not (root / "cells").exists()
    # one cell of breakout recorded before (as another run's), exported beside the study file
    other = runner.Group("minatar:breakout", [("ppo_hi", 0)], runner.cell_spec(study, "ppo_hi", "minatar:breakout", 0))
    runner.write_export(study, runner.run_group(study, other, root, f"sqlite:///{root / 'mlflow.db'}"))
    assert "time left for minatar:space_invaders: " in runner.status_text(study, root, 1, ("minatar:space_invaders",))
    assert study_main(["run", str(path), "--envs", "minatar:space_invaders", "--workers", "1", "--executor", "local",
                       "--run-root", str(root)]) == 0
    recorded = {(c.arm, c.env) for c in runner.recorded(root).values()}
    assert recorded == {("ppo_hi", "minatar:breakout"), ("ppo_ewma", "minatar:space_invaders"),
                        ("ppo_hi", "minatar:space_invaders")}
    rows = study.cells_csv.read_text().splitlines()[1:]
    assert len(rows) == 3 and sum("minatar:breakout" in r for r in rows) == 1
    capsys.readouterr()
    assert study_main(["status", str(path), "--envs", "minatar:breakout", "--run-root", str(root), "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "3 done, 0 running" in out and "1 pending of 4 cells" in out and "time left for minatar:breakout" in out


def test_study_arms_plans_only_those_arms_and_an_unknown_arm_is_one_line(tmp_path, capsys):
    """``--arms a``: the planned groups hold a's members alone (the two arms of the file pack into one
    group without it), with ``--envs`` on those envs; ``status --arms`` counts their time left; an arm the
    file does not have is one line (run, before anything trains), and a report refuses ``--arms``."""
    from ppo_lightning.studies import runner
    from ppo_lightning.studies.command import main as study_main

    path = tiny(tmp_path, envs=["minatar:breakout", "minatar:space_invaders"])
    study = load_study(path)
    both = runner.plan(study, set(), 1)
    assert {a for g in both for a, _ in g.members} == {"ppo_hi", "ppo_ewma"} and len(both) == 2
    only = runner.plan(study, set(), 1, envs=("minatar:space_invaders",), arms=("ppo_hi",))
    assert [(g.env, g.members) for g in only] == [("minatar:space_invaders", [("ppo_hi", 0)])]
    root = tmp_path / "runs"
    assert "time left for ppo_hi: " in runner.status_text(study, root, 1, arms=("ppo_hi",))
    assert "time left for minatar:breakout x ppo_hi: " in runner.status_text(study, root, 1, ("minatar:breakout",), ("ppo_hi",))
    capsys.readouterr()
    assert study_main(["run", str(path), "--arms", "ppo_lo", "--run-root", str(root)]) == 2
    assert study_main(["report", str(path), "--arms", "ppo_hi", "--no-plots", "--out", str(tmp_path / "out")]) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 2 and "--arms 'ppo_lo': ppo_lo not among the study's arms (ppo_ewma, ppo_hi)" in out[0], out
    assert "--arms is for study run and status" in out[1] and not (root / "cells").exists()


@pytest.mark.timeout(300)
def test_a_killed_group_resumes_from_its_checkpoint_and_ends_as_an_uninterrupted_one(tmp_path, monkeypatch):
    """Stopped by SIGTERM in iteration 2 (the project's preemption: checkpoint, exit 143, nothing
    recorded), the group's rerun continues from its last checkpoint and records the cells an
    uninterrupted group records, then drops its checkpoints."""
    import sys

    from ppo_lightning.studies import runner

    sys.path.insert(0, str(ROOT / "tests"))  # cluster_helpers.SignalAt, by class path
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(runner, "CHECKPOINT_FRAMES", 64)  # every iteration (4 envs x 16 steps)
    signal_at = {"class_path": "cluster_helpers.SignalAt", "init_args": {"signum": "SIGTERM", "phase": "update", "iteration": 2}}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    stopped = load_study(tiny(tmp_path / "a", fit={**TINY_FIT, "trainer.callbacks+": json.dumps(signal_at)}))
    plain = load_study(tiny(tmp_path / "b"))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    group = runner.plan(stopped, set(), 1)[0]
    with pytest.raises(SystemExit) as stop:
        runner.run_group(stopped, group, tmp_path / "a" / "runs", uri)
    assert stop.value.code == 143 and not (tmp_path / "a" / "runs" / "cells").exists()
    ckpt = tmp_path / "a" / "runs" / "groups" / group.name / "checkpoints"
    assert (ckpt / "last.ckpt").exists()
    assert "0 done, 2 running" in runner.status_text(stopped, tmp_path / "a" / "runs")
    resumes = []
    original = runner.resume_spec
    monkeypatch.setattr(runner, "resume_spec", lambda *a, **k: resumes.append(original(*a, **k)) or resumes[-1])
    resumed = runner.run_group(stopped, group, tmp_path / "a" / "runs", uri)
    assert resumes[-1][1] == ckpt / "last.ckpt" and not ckpt.exists()
    whole = runner.run_group(plain, runner.plan(plain, set(), 1)[0], tmp_path / "b" / "runs", uri)
    assert [(c.arm, c.curve, c.auc_return, c.final_return) for c in resumed] == [
        (c.arm, c.curve, c.auc_return, c.final_return) for c in whole]
    # the cells' times sum both attempts: the stopped one's (kept at its stop) and the resumed one's
    first = json.loads((tmp_path / "a" / "runs" / "groups" / group.name / "attempts.json").read_text())
    assert len(first) == 1 and first[0]["train_s"] > 0
    n = len(group.members)
    assert all(c.attempts == 2 and c.train_s * n > first[0]["train_s"] and c.wall_s * n > first[0]["wall_s"] for c in resumed)
    assert all(c.attempts == 1 for c in whole)


def test_attempt_times_split_where_the_clock_or_the_steps_restart():
    from ppo_lightning.studies.runner import attempt_train_times

    # (timestamp, step, elapsed): an attempt to step 3 (killed), one resumed from step 2 to 5
    history = [(1, 1, 2.0), (2, 2, 4.0), (3, 3, 6.0), (9, 3, 2.5), (10, 4, 4.5), (11, 5, 6.5)]
    assert attempt_train_times(history) == [6.0, 6.5]
    assert attempt_train_times(history[:3]) == [6.0] and attempt_train_times([]) == []
    assert attempt_train_times([(1, 1, 1.0), (5, 1, 3.0)]) == [1.0, 3.0]  # the same step again: a new attempt


def test_the_curves_plot_every_arm_and_name_the_envs_an_arm_lacks(tmp_path):
    """An arm with no run on one env is in the panels of the envs it has and named under the pooled
    one (and in the report's text), not dropped."""
    from ppo_lightning.studies.records import Cell
    from ppo_lightning.studies.report import curve_panels, markdown, missing_envs, plot

    study = load_study(tiny(tmp_path, envs=["minatar:breakout", "minatar:asterix"], seeds={"count": 3, "first": 0}))
    curve = [(64.0, 1.0), (128.0, 2.0), (256.0, 3.0)]
    cells = {(a, e, s): Cell(a, e, s, 256, 2.0 + s, 3.0, curve=curve) for a in study.arms for e in study.envs for s in range(3)
             if not (a == "ppo_hi" and e == "minatar:asterix")}
    grid = np.linspace(32, 256, 8)
    panels = curve_panels(study, cells, list(study.arms), grid)
    assert list(panels["pooled"]) == ["ppo_ewma"] and panels["pooled"]["ppo_ewma"].shape == (3, 2, 8)
    assert list(panels["minatar:breakout"]) == ["ppo_ewma", "ppo_hi"] and list(panels["minatar:asterix"]) == ["ppo_ewma"]
    assert panels["minatar:breakout"]["ppo_hi"][:, 0, -1].tolist() == [3.0] * 3
    assert missing_envs(study, cells) == {"ppo_hi": ["minatar:asterix"]}
    assert "PPO, lr 1e-3 (no asterix)" in markdown(study, [], cells, {})
    assert plot(study, cells, [], tmp_path / "tiny.md")["sample efficiency"].exists()


def test_the_plots_draw_every_compared_arm_in_its_own_color():
    """Table 1 compares 14 arms: the curves and profiles draw all 14 (not the first 10 of the default
    color cycle), each in a color of its own."""
    from ppo_lightning.studies.report import arm_colors, plotted_arms

    study = load_study(ROOT / "experiments" / "studies" / "mujoco_ppo_table1.yaml")
    arms = plotted_arms(study)
    assert len(arms) == len(study.arms) == 14 and set(arms) == set(study.arms)
    for n in (3, 10, 14, 25):
        colors = arm_colors([f"a{i}" for i in range(n)])
        assert len({str(c) for c in colors.values()}) == n


def test_many_arms_split_over_images_of_at_most_14_each(tmp_path):
    """28 arms: two curve images and two profile images of 14 arms, every arm in one of them; the report
    names every image."""
    from ppo_lightning.studies.records import Cell
    from ppo_lightning.studies.report import arm_chunks, plot

    assert [len(c) for c in arm_chunks(list(range(28)))] == [14, 14]
    assert [len(c) for c in arm_chunks(list(range(16)))] == [8, 8]
    assert [len(c) for c in arm_chunks(list(range(29)))] == [10, 10, 9]
    assert [len(c) for c in arm_chunks(list(range(14)))] == [14] and arm_chunks([]) == []
    assert sum(arm_chunks(list(range(29))), []) == list(range(29))
    arms = [{"name": f"a{i}", "label": f"arm {i}", "fit": {"model.lr": 0.001 * (i + 1)}} for i in range(16)]
    comps = [{"claim": f"a{i} differs from a0", "a": f"a{i}", "b": "a0"} for i in range(1, 16)]
    study = load_study(tiny(tmp_path, arms=arms, comparisons=comps, seeds={"count": 2, "first": 0}))
    curve = [(64.0, 1.0), (128.0, 2.0), (256.0, 3.0)]
    cells = {(a, e, s): Cell(a, e, s, 256, 2.0 + s, 3.0, curve=curve) for a in study.arms for e in study.envs for s in range(2)}
    made = plot(study, cells, [], tmp_path / "many.md")
    assert {k: v.name for k, v in made.items()} == {
        "sample efficiency": "many_curves.png", "sample efficiency (2)": "many_curves_2.png",
        "performance profiles": "many_profiles.png", "performance profiles (2)": "many_profiles_2.png"}
    assert all(v.exists() for v in made.values())


def test_a_full_disk_while_writing_study_records_is_one_line_and_keeps_every_record(tmp_path):
    """Issue 38 for the study records, on a real 256 kB tmpfs holding the study file, its export and its
    run root: writes that do not fit raise one line (what, where, bytes needed and free), leave no
    temporary file and keep every record written before, byte for byte; `study run` says so and exits 5."""
    import subprocess
    import sys
    from dataclasses import asdict

    from ppo_lightning.core.errors import StorageFull
    from ppo_lightning.studies import records, runner

    disk = tmp_path / "disk"
    disk.mkdir()
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip(f"mount -t tmpfs is not permitted here ({(out.stderr or out.stdout).strip()[:200]})")
    try:
        study = load_study(tiny(disk, seeds={"count": 2, "first": 0}))
        root = disk / "runs"
        curve = [(float(f), 1.0 + f / 7) for f in range(0, 25_600, 128)]  # 200 points: ~7 kB of CSV per cell
        cells = [records.Cell(a, "minatar:breakout", s, 25_600, 1.0, 1.0, curve=curve) for a in study.arms for s in (0, 1)]
        for c in cells:
            runner._write_json(runner._cell_path(root, c.arm, c.env, c.seed), asdict(c), "the cell record")
        records.write_export(study, cells[:2])  # the export as a runner left it after two cells
        before = {p: p.read_bytes() for p in disk.rglob("*") if p.is_file()}
        free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
        (disk / "filler").write_bytes(b"\0" * (free - 4096))  # 4 kB left

        with pytest.raises(StorageFull) as err:
            records.write_export(study, cells)
        line = str(err.value)
        assert "\n" not in line and line.startswith("no space left on device while writing the study's curve export "), line
        assert "kB free)" in line and "nothing partial was left" in line and " (needs 3" in line  # ~34 kB
        longer = asdict(cells[0]) | {"curve": curve * 3}
        with pytest.raises(StorageFull, match="while writing the cell record"):
            runner._write_json(runner._cell_path(root, cells[0].arm, cells[0].env, cells[0].seed), longer, "the cell record")
        run = subprocess.run([sys.executable, "-m", "ppo_lightning.cli.main", "study", "run", str(study.path), "--run-root",
                              str(root), "--workers", "1"], capture_output=True, text=True, cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})  # every cell recorded: the export only
        said = [x for x in (run.stdout + run.stderr).splitlines() if x.startswith("error: ")]
        assert run.returncode == 5 and "Traceback" not in run.stderr, run.stdout + run.stderr[-2000:]
        assert len(said) == 1 and "the cells recorded before it are kept" in said[0] and "study run" in said[0], said
        assert {p: p.read_bytes() for p in before} == before and not list(disk.rglob("*.tmp"))
        assert len(runner.recorded(root)) == 4
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def test_a_group_another_process_trains_is_left_to_it(tmp_path, capsys):
    """While another process holds a group's lock (a killed launcher's job still training it), a worker
    given the group trains nothing and records nothing; the lock is free again once its holder lets go."""
    from ppo_lightning.studies import runner

    study = load_study(tiny(tmp_path))
    group = runner.plan(study, set(), 1)[0]
    root = tmp_path / "runs"
    held = runner.group_lock(root, group.name)
    assert held is not None and runner.group_lock(root, group.name) is None
    assert runner.run_group(study, group, root, f"sqlite:///{tmp_path / 'mlflow.db'}") == []
    assert f"{group.name}: another process trains it now" in capsys.readouterr().out
    assert not (root / "cells").exists() and not (root / "groups" / group.name).exists()
    os.close(held)
    again = runner.group_lock(root, group.name)
    assert again is not None
    os.close(again)


@pytest.mark.timeout(300)
def test_a_launcher_leaves_a_locked_group_to_its_holder_without_failing(tmp_path):
    """Two `study run` launchers on one run root share its groups through the group locks: the one that
    finds a group locked leaves it to the holder, exits 0 and leaves the study's parent run open for the
    holder's records (no FAILED run for cells another process records); once the lock is free a rerun
    trains the group and ends the parent run FINISHED."""
    import subprocess
    import sys

    from mlflow.tracking import MlflowClient

    from ppo_lightning.studies import runner

    study = load_study(tiny(tmp_path))
    root, uri = tmp_path / "runs", f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    launch = [sys.executable, "-m", "ppo_lightning.cli.main", "study", "run", str(study.path), "--run-root", str(root),
              "--tracking-uri", uri, "--workers", "1", "--executor", "local"]

    def parents():
        exp = MlflowClient(uri).get_experiment_by_name(study.name)
        return [] if exp is None else MlflowClient(uri).search_runs([exp.experiment_id], "tags.study_parent = 'true'")

    held = runner.group_lock(root, runner.plan(study, set(), 1)[0].name)  # the other launcher's job, training it
    try:
        run = subprocess.run(launch, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=240)
    finally:
        os.close(held)
    out = run.stdout + run.stderr
    assert run.returncode == 0 and "Traceback" not in out, out[-3000:]
    assert "2 cells left to another process that trains their groups now" in out and "failed" not in out, out[-3000:]
    assert not list((root / "cells").glob("*.json")) and all(r.info.status == "RUNNING" for r in parents())
    run = subprocess.run(launch, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=240)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert len(list((root / "cells").glob("*.json"))) == 2 and [r.info.status for r in parents()] == ["FINISHED"]


@pytest.mark.timeout(300)
def test_a_launcher_stopped_by_sigterm_stops_its_local_jobs_and_a_rerun_continues(tmp_path, monkeypatch):
    """SIGTERM to `study run` while its local job trains: the job checkpoints and stops (no process of
    it is left), the launcher exits 143 with one line, and a rerun continues the group from its
    checkpoint and records every cell."""
    import signal
    import subprocess
    import sys
    import time

    from ppo_lightning.studies import runner

    monkeypatch.chdir(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    monkeypatch.setenv("PYTHONPATH", env["PYTHONPATH"])
    path = tiny(tmp_path, frames=16384)
    root, uri = tmp_path / "runs", f"sqlite:///{tmp_path / 'mlflow.db'}"
    launcher = subprocess.Popen([sys.executable, "-m", "ppo_lightning", "study", "run", str(path), "--workers", "1",
                                 "--executor", "local", "--run-root", str(root), "--tracking-uri", uri,
                                 "--checkpoint-frames", "64"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 200
    while not list(root.glob("groups/*/checkpoints/iteration-*.ckpt")):  # the job's training is under way
        assert launcher.poll() is None and time.monotonic() < deadline, "the job did not start training"
        time.sleep(0.2)
    launcher.send_signal(signal.SIGTERM)
    out, _ = launcher.communicate(timeout=180)
    assert launcher.returncode == 143, out
    assert "[study] stopped by SIGTERM: 1 local job(s) checkpointed and stopped" in out
    assert not [pid for pid, cmd in _cmdlines() if str(root / "submitit") in cmd], "a job outlived its launcher"
    assert not (root / "cells").exists() and list(root.glob("groups/*/checkpoints/last.ckpt"))
    assert runner.run_study(load_study(path), workers=1, executor="local", run_root=root, tracking_uri=uri, poll_s=1) == 0
    cells = [json.loads(p.read_text()) for p in (root / "cells").glob("*.json")]
    assert len(cells) == 2 and all(c["attempts"] == 2 and c["frames"] == 16384 for c in cells)  # continued, not restarted


@pytest.mark.timeout(120)
def test_a_local_job_that_ignores_sigterm_is_cancelled_after_the_grace(tmp_path, capsys):
    """A local job whose task ignores SIGTERM (a signal before its training set its handler) is
    cancelled through submitit (``job.cancel()``) once the grace has passed: no process of it is left
    and the launcher's line counts it as killed."""
    import signal
    import time

    import submitit

    from ppo_lightning.studies import runner

    ready = tmp_path / "ready"
    ex = submitit.LocalExecutor(folder=tmp_path / "submitit")
    ex.update_parameters(timeout_min=5)
    job = ex.submit(exec, "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                          f"open({str(ready)!r}, 'w').close()\ntime.sleep(60)\n")
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert time.monotonic() < deadline and not job.done(), "the job did not start"
        time.sleep(0.1)
    with pytest.raises(SystemExit) as stopped:
        with runner.jobs_stop_with_the_launcher([job], "study", "a rerun", grace_s=1.0):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)
    assert stopped.value.code == 128 + signal.SIGTERM and job.done()
    assert "0 local job(s) checkpointed and stopped, 1 killed after 1 s" in capsys.readouterr().out
    assert not [pid for pid, cmd in _cmdlines() if str(tmp_path / "submitit") in cmd], "the job outlived its cancel"


def _cmdlines():
    for p in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            yield p.parent.name, p.read_bytes().replace(b"\0", b" ").decode(errors="ignore")
        except OSError:
            continue


# ----------------------------------------------------------------------------------- issue 47: claims a reader can check
def test_holm_on_cases_with_a_known_answer():
    from ppo_lightning.studies.analysis import holm

    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1: 0.02, 0.03, 0.06, 0.04 -> running max 0.02, 0.03, 0.06, 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert holm([0.02]) == pytest.approx([0.02])          # a family of one: unadjusted
    out = holm([0.01, float("nan"), 0.02])                 # a test not made is not in the family
    assert out[0] == pytest.approx(0.02) and math.isnan(out[1]) and out[2] == pytest.approx(0.02)
    # four games each at p = 0.02: each alone would be bold, none survives the family of four
    assert all(p > 0.05 for p in holm([0.02] * 4))


def test_welch_p_is_scipys_and_a_difference_test_never_says_equal():
    from scipy.stats import ttest_ind

    from ppo_lightning.studies.analysis import compare, welch_p

    rng = np.random.default_rng(3)
    a, b = rng.normal(0, 1, 6), rng.normal(0.5, 2, 8)
    assert welch_p(a, b) == pytest.approx(ttest_ind(a, b, equal_var=False).pvalue, rel=1e-10)
    x = rng.normal(0.5, 0.01, (8, 2))
    out = compare(x, x + 0.001, test="difference", margin=None, target=0.05, reps=2000)
    assert out["verdict"] == "no difference resolved" and "equal" not in out["verdict"]
    wide = compare(x, x + rng.normal(0, 0.5, (8, 2)), test="difference", margin=None, target=0.05, reps=2000)
    assert "CI half-width" in wide["verdict"] and "> target 0.05" in wide["verdict"]  # the header's rule, said in the row


def _study_with_cells(tmp_path: Path, name: str, seeds: dict, effect: dict[str, float], extra: dict | None = None,
                      missing: set | None = None, noise: float = 0.01, precision: str = "32-true") -> Path:
    """A two-env study file (score raw) and its export CSV: arm a scores b + effect[env] on each seed."""
    from ppo_lightning.studies.records import Cell, write_export

    path = tiny(tmp_path, study=name, envs=["minatar:breakout", "minatar:asterix"], seeds=seeds,
                comparisons=[{"claim": "EWMA beats PPO", "a": "ppo_ewma", "b": "ppo_hi", "test": "difference", "metric": "auc"}],
                **(extra or {}))
    path = path.rename(tmp_path / f"{name}.yaml")
    study = load_study(path)
    rng = np.random.default_rng(seeds["first"])
    cells = []
    for arm in study.arms:
        for env in study.envs:
            for s in study.seeds:
                if (arm, env, s) in (missing or set()):
                    continue
                v = 1.0 + (effect[env] if arm == "ppo_ewma" else 0.0) + rng.normal(0, noise)
                cells.append(Cell(arm, env, s, 256, v, v, "CPU: AMD EPYC, 2 cores, avx2", precision, 1.0, 1.0))
    write_export(study, cells)
    return path


def test_a_study_with_selection_and_confirmation_seeds_reports_both(tmp_path):
    """Selection seeds 0-5 show the effect on both games; fresh seeds 100-105 on Breakout only (Asterix
    the other way): the pooled claim holds on both, the per-game claim holds on Breakout, not on Asterix."""
    from ppo_lightning.studies.report import report

    fresh = _study_with_cells(tmp_path, "fresh", {"count": 6, "first": 100}, {"minatar:breakout": 0.3, "minatar:asterix": -0.1})
    sel = _study_with_cells(tmp_path, "sel", {"count": 6, "first": 0}, {"minatar:breakout": 0.2, "minatar:asterix": 0.2},
                            extra={"selection": "lr chosen on seeds 0-5", "confirm": {"study": fresh.name}})
    study = load_study(sel)
    assert [c.seeds for c in study.confirmation()] == [tuple(range(100, 106))]
    text = report(study, tmp_path / "out", plots=False)
    assert "selection (0-5)" in text and "fresh (100-105, 32-true)" in text and "lr chosen on seeds 0-5" in text
    row = next(line for line in text.splitlines() if line.startswith("| EWMA beats PPO (PPO-EWMA vs PPO, lr 1e-3) | AUC | selection (0-5) | **+"))
    assert row.endswith("| **holds** |"), row
    row = next(line for line in text.splitlines() if line.startswith("| EWMA beats PPO (PPO-EWMA vs PPO, lr 1e-3) | AUC | fresh (100-105, 32-true) | **+"))
    assert row.endswith("| **holds** |"), row
    games = {line.split(" | ")[2]: line for line in text.splitlines() if line.count(" | ") == 5 and "| AUC | " in line}
    assert games["breakout"].endswith("| **holds** |") and games["asterix"].endswith("| does not hold |")
    # a claim that does not hold on the fresh seeds is no headline: its selection row is not bold and says why
    bad = _study_with_cells(tmp_path, "fresh2", {"count": 6, "first": 200}, {"minatar:breakout": -0.2, "minatar:asterix": -0.2})
    sel2 = _study_with_cells(tmp_path, "sel2", {"count": 6, "first": 0}, {"minatar:breakout": 0.2, "minatar:asterix": 0.2},
                             extra={"confirm": {"study": bad.name}})
    text = report(load_study(sel2), tmp_path / "out", plots=False)
    main = next(line for line in text.splitlines() if "stratified bootstrap)" in line)
    assert "**" not in main.split(" | ")[3] and "fresh seeds: does not hold" in main
    assert "| does not hold (a < b on fresh seeds) |" in text  # the fresh row says why


def test_two_confirming_studies_in_two_precisions_measure_the_precision_apart_from_selection(tmp_path):
    """The same fresh seeds in 32-true (effect +0.2 on both games) and in bf16-mixed (+0.1): the report
    gives the claim on each, and precision's effect: arm a -0.1, arm b 0, the claim's effect -0.1."""
    from ppo_lightning.studies.report import report

    f32 = _study_with_cells(tmp_path, "f32", {"count": 6, "first": 100}, {"minatar:breakout": 0.2, "minatar:asterix": 0.2})
    f16 = _study_with_cells(tmp_path, "f16", {"count": 6, "first": 100}, {"minatar:breakout": 0.1, "minatar:asterix": 0.1},
                            precision="bf16-mixed", extra={"fit": {**TINY_FIT, "trainer.precision": "bf16-mixed"}})
    sel = _study_with_cells(tmp_path, "sel", {"count": 6, "first": 0}, {"minatar:breakout": 0.2, "minatar:asterix": 0.2},
                            precision="bf16-mixed", extra={"confirm": {"study": [f32.name, f16.name]}})
    text = report(load_study(sel), tmp_path / "out", plots=False)
    assert "fresh (100-105, 32-true)" in text and "fresh (100-105, bf16-mixed)" in text
    assert "`f16.yaml` sets `trainer.precision` bf16-mixed (here: 32-true)" in text  # what else differs, said
    row = next(line for line in text.splitlines() if line.startswith("| EWMA beats PPO (PPO-EWMA vs PPO, lr 1e-3) | AUC | selection (0-5)"))
    assert row.endswith("| **holds** |")  # it holds on both fresh sets
    factor = next(line for line in text.splitlines() if line.startswith("| PPO-EWMA vs PPO, lr 1e-3 | AUC | **-0.1"))
    a, b, claim = factor.split(" | ")[2:5]
    assert a.startswith("**-0.10") and not b.startswith("**") and claim.startswith("**-0.10"), factor


def test_confirmation_seeds_must_be_fresh_and_partial_records_are_pending(tmp_path):
    from ppo_lightning.studies.records import cell_files
    from ppo_lightning.studies.report import report

    fresh = _study_with_cells(tmp_path, "fresh", {"count": 6, "first": 3}, {"minatar:breakout": 0.2, "minatar:asterix": 0.2})
    with pytest.raises(StudyError, match=r"confirm.study: seeds \[3, 4, 5\] are also this study's"):
        _study_with_cells(tmp_path, "sel", {"count": 6, "first": 0}, {"minatar:breakout": 0.2, "minatar:asterix": 0.2},
                          extra={"confirm": {"study": fresh.name}})
    # a confirmation in progress: no export yet, 3 cell files in its run root (the runner's format)
    (tmp_path / "fresh.cells.csv").unlink()
    (tmp_path / "fresh.yaml").write_text((tmp_path / "fresh.yaml").read_text().replace("first: 3", "first: 1000"))
    root = tmp_path / "runs" / "fresh" / "cells"
    root.mkdir(parents=True)
    from dataclasses import asdict

    from ppo_lightning.studies.records import Cell

    for arm, env, seed in [("ppo_ewma", "minatar:breakout", 1000), ("ppo_hi", "minatar:breakout", 1000), ("ppo_hi", "minatar:asterix", 1001)]:
        c = Cell(arm, env, seed, 256, 1.0, 1.0, "CPU: AMD EPYC, avx512", "32-true", 1.0, 1.0, "g", "", "run", [(256.0, 1.0)])
        (root / f"{arm}__{env.replace(':', '-')}__{seed}.json").write_text(json.dumps(asdict(c)))
    assert len(cell_files(tmp_path / "runs" / "fresh")) == 3
    sel = _study_with_cells(tmp_path, "sel", {"count": 6, "first": 0}, {"minatar:breakout": 0.2, "minatar:asterix": 0.2},
                            extra={"confirm": {"study": "fresh.yaml"}})
    text = report(load_study(sel), tmp_path / "out", plots=False, runs=tmp_path / "runs")
    assert "3 of 24 cells recorded" in text and "| pending |" in text


def test_a_game_that_finished_on_fresh_seeds_is_judged_while_the_others_run(tmp_path):
    """Fresh seeds with Breakout done and Asterix not started: the pooled claim is pending, Breakout's
    per-game row has its effect and verdict now, its p adjusted by Holm over both games (the missing
    one counted at p = 1), and Asterix's row is pending."""
    from ppo_lightning.studies.analysis import holm, welch_p
    from ppo_lightning.studies.records import export_cells
    from ppo_lightning.studies.report import report

    missing = {(arm, "minatar:asterix", s) for arm in ("ppo_ewma", "ppo_hi") for s in range(100, 106)}
    fresh = _study_with_cells(tmp_path, "fresh", {"count": 6, "first": 100}, {"minatar:breakout": -0.2, "minatar:asterix": 0.0},
                              missing=missing, noise=0.05)
    sel = _study_with_cells(tmp_path, "sel", {"count": 6, "first": 0}, {"minatar:breakout": 0.2, "minatar:asterix": 0.2},
                            extra={"confirm": {"study": fresh.name}})
    text = report(load_study(sel), tmp_path / "out", plots=False)
    assert "| AUC | fresh (100-105, 32-true) | pending (0 vs 0 seeds) |" in text
    games = {line.split(" | ")[2]: line for line in text.splitlines() if line.count(" | ") == 5 and "| AUC | " in line}
    breakout = games["breakout"].split(" | ")
    assert breakout[4].startswith("**-0.2") and games["breakout"].endswith("| does not hold |"), games["breakout"]
    cells = export_cells(load_study(fresh))
    a = np.array([c.auc_return for k, c in sorted(cells.items()) if c.arm == "ppo_ewma"])
    b = np.array([c.auc_return for k, c in sorted(cells.items()) if c.arm == "ppo_hi"])
    assert f"(p {holm([welch_p(a, b), 1.0])[0]:.3f})" in breakout[4], breakout[4]
    assert games["asterix"].split(" | ")[4] == "-" and games["asterix"].endswith("| pending |"), games["asterix"]


def test_a_game_the_selection_seeds_did_not_resolve_has_nothing_to_confirm_while_fresh_seeds_run(tmp_path):
    """Asterix shows no effect on the selection seeds and has not run on the fresh ones: its row says
    there is nothing to confirm, not pending (no fresh result could make it a claim)."""
    from ppo_lightning.studies.report import report

    missing = {(arm, "minatar:asterix", s) for arm in ("ppo_ewma", "ppo_hi") for s in range(100, 106)}
    fresh = _study_with_cells(tmp_path, "fresh", {"count": 6, "first": 100}, {"minatar:breakout": 0.2, "minatar:asterix": 0.0},
                              missing=missing, noise=0.05)
    sel = _study_with_cells(tmp_path, "sel", {"count": 6, "first": 0}, {"minatar:breakout": 0.2, "minatar:asterix": 0.0},
                            extra={"confirm": {"study": fresh.name}}, noise=0.05)
    text = report(load_study(sel), tmp_path / "out", plots=False)
    games = {line.split(" | ")[2]: line for line in text.splitlines() if line.count(" | ") == 5 and "| AUC | " in line}
    assert games["breakout"].endswith("| **holds** |"), games["breakout"]
    asterix = games["asterix"].split(" | ")
    assert "(p 0.0" not in asterix[3] and asterix[4] == "-", games["asterix"]
    assert games["asterix"].endswith("| nothing to confirm (not resolved on the selection seeds) |"), games["asterix"]


def test_a_claim_the_selection_seeds_did_not_make_is_never_pending_or_confirmed():
    from types import SimpleNamespace as R

    from ppo_lightning.studies.report import holds_on_fresh

    unresolved = R(test="difference", low=-0.01, high=0.07, tost_p=None)
    resolved = R(test="difference", low=0.02, high=0.07, tost_p=None)
    pending = R(test="difference", low=float("nan"), high=float("nan"), tost_p=None, pending=True)
    ahead, behind = R(test="difference", low=0.01, high=0.05, tost_p=None), R(test="difference", low=-0.05, high=-0.01, tost_p=None)
    assert holds_on_fresh(unresolved, pending).startswith("nothing to confirm")
    assert holds_on_fresh(unresolved, ahead).startswith("nothing to confirm")
    assert holds_on_fresh(resolved, pending) == "pending"
    assert holds_on_fresh(resolved, ahead) == "holds" and holds_on_fresh(resolved, behind).startswith("does not hold")
    not_equal, equal = R(test="equivalence", low=-0.1, high=0.1, tost_p=0.3), R(test="equivalence", low=-0.01, high=0.01, tost_p=0.001)
    assert holds_on_fresh(not_equal, pending).startswith("nothing to confirm (not shown equal")
    assert holds_on_fresh(equal, pending) == "pending" and holds_on_fresh(equal, equal) == "holds"
    assert holds_on_fresh(equal, None) == "not run on fresh seeds"


def test_a_report_that_drops_a_comparison_fails(tmp_path, monkeypatch):
    from ppo_lightning.studies import report as R

    path = _study_with_cells(tmp_path, "s", {"count": 5, "first": 0}, {"minatar:breakout": 0.1, "minatar:asterix": 0.1},
                             missing={("ppo_hi", "minatar:asterix", s) for s in range(5)})
    text = R.report(load_study(path), tmp_path / "out", plots=False)  # no seed of b has both envs: a pending row, not none
    assert "| EWMA beats PPO (PPO-EWMA vs PPO, lr 1e-3) | AUC |" in text and "pending: 5 and 0 seeds" in text
    full = _study_with_cells(tmp_path, "t", {"count": 5, "first": 0}, {"minatar:breakout": 0.1, "minatar:asterix": 0.1})
    original = R.analyse
    monkeypatch.setattr(R, "analyse", lambda *a, **k: original(*a, **k)[:-1])
    with pytest.raises(ValueError, match="drops comparisons of the study file: EWMA beats PPO"):
        R.report(load_study(full), tmp_path / "out", plots=False)


def test_an_interim_report_pools_only_the_envs_it_names_and_leaves_the_whole_report_alone(tmp_path, capsys):
    """Arm a is 0.3 above b on Breakout and 0.3 below on Asterix: over both envs nothing is resolved;
    `--envs minatar:breakout` resolves a > b, says which envs it leaves out, writes its own file, drops
    a comparison on Asterix alone (and names it), and refuses --into (a page's block is the whole study)."""
    from dataclasses import replace

    from ppo_lightning.studies import report as R
    from ppo_lightning.studies.command import main as study_main
    from ppo_lightning.studies.spec import Comparison

    path = _study_with_cells(tmp_path, "s", {"count": 5, "first": 0}, {"minatar:breakout": 0.3, "minatar:asterix": -0.3})
    out = tmp_path / "out"
    whole = R.report(load_study(path), out, plots=False)
    row = next(line for line in whole.splitlines() if line.startswith("| EWMA beats PPO (PPO-EWMA vs PPO, lr 1e-3) | AUC | breakout + asterix"))
    assert "no difference resolved" in row, row
    assert study_main(["report", str(path), "--envs", "minatar:breakout", "--out", str(out), "--no-plots"]) == 0
    interim = (out / "s_over_1_envs.md").read_text()
    assert interim.startswith("**Interim: over 1 of the study's 2 envs** (minatar:breakout); left out: minatar:asterix")
    row = next(line for line in interim.splitlines() if line.startswith("| EWMA beats PPO (PPO-EWMA vs PPO, lr 1e-3) | AUC | breakout |"))
    assert "| **+0.3" in row and "a > b" in row, row
    assert (out / "s.md").read_text() == whole  # the whole study's report is not touched
    study = load_study(path)
    only_asterix = replace(study, comparisons=study.comparisons + (Comparison("on Asterix", "ppo_ewma", "ppo_hi", envs=("minatar:asterix",)),))
    view = only_asterix.over_envs(("minatar:breakout",))
    assert [c.claim for c in view.comparisons] == ["EWMA beats PPO"] and view.envs == ("minatar:breakout",)
    assert "comparisons on none of these envs, left out: on Asterix" in R.report(only_asterix, out, plots=False, envs=("minatar:breakout",))
    page = tmp_path / "page.md"
    page.write_text("x\n")
    capsys.readouterr()
    assert study_main(["report", str(path), "--envs", "minatar:breakout", "--into", str(page), "--no-plots", "--out", str(out)]) == 2
    assert study_main(["report", str(path), "--envs", "minatar:pong", "--no-plots", "--out", str(out)]) == 2
    errors = capsys.readouterr().out.strip().splitlines()
    assert len(errors) == 2 and "--into" in errors[0] and "minatar:pong" in errors[1], errors
    assert page.read_text() == "x\n"


def test_every_committed_study_report_has_every_comparison():
    from ppo_lightning.studies.report import covered

    for f in sorted((ROOT / "experiments" / "studies").glob("*.yaml")):
        study = load_study(f)
        md = ROOT / "experiments" / "results" / "studies" / f"{f.stem}.md"
        if study.comparisons and md.exists():
            assert covered(study, md.read_text()) == [], f.name


def test_table1_scores_as_the_paper_random_zero_best_one_with_known_answers():
    """Synthetic records of the Table 1 study: per task, setting k's last-100-episode return is
    R_random + paper_k x 100 on every seed (the paper's best, clip 0.2 at 0.82, the best here too),
    so each setting's score is paper_k / 0.82 exactly; the report puts it beside the paper's, and
    every ordering claim of the file is a row."""
    from ppo_lightning.studies.records import Cell, normalizer
    from ppo_lightning.studies.report import analyse, covered, markdown

    study = load_study(ROOT / "experiments" / "studies" / "mujoco_ppo_table1.yaml")
    assert len(study.envs) == 7 and all(e.endswith("-v5") for e in study.envs) and len(study.seeds) >= 3
    assert sum(a.paper is not None for a in study.arms.values()) == 11
    rng = np.random.default_rng(0)
    cells = {}
    for arm, a in study.arms.items():
        k = a.paper if a.paper is not None else 0.82
        for env in study.envs:
            for s in study.seeds:
                v = study.score_ref.random[env] + 100 * k + (rng.normal(0, 1e-3) if arm != "clip_0.2" else 0.0)
                cells[(arm, env, s)] = Cell(arm, env, s, 1_000_000, v, v, "CPU: AMD EPYC, avx2", "32-true", 1.0, 1.0,
                                            last100_return=v)
    norm = normalizer(study, cells)
    env = "Hopper-v5"
    assert norm(env, study.score_ref.random[env]) == 0.0 and norm(env, study.score_ref.random[env] + 82) == pytest.approx(1.0)
    results = analyse(study, cells)
    text = markdown(study, results, cells, {})
    assert covered(study, text) == []
    row = next(line for line in text.splitlines() if line.startswith("| No clipping or penalty | -0.39 |"))
    assert f"{-0.39 / 0.82:.2f} (n = 3: " in row, row  # 3 seeds: the mean, n and the runs, no interval
    assert next(line for line in text.splitlines() if line.startswith("| Clipping, eps = 0.2 | 0.82 |")).split(" | ")[2].startswith("1.00")
    best = [r for r in results if r.a == "clip_0.2"]
    assert len(best) == 10 and all(r.verdict.startswith("a > b") for r in best)
    # records without the last-100 score (none recorded yet): every claim a pending row, no crash
    empty = {k: Cell(*k, 1_000_000, 1.0, 1.0) for k in list(cells)[:5]}
    text = markdown(study, analyse(study, empty), empty, {})
    assert covered(study, text) == [] and "pending" in text


def test_executor_auto_is_slurm_only_where_a_controller_answers(tmp_path, monkeypatch, capsys):
    """submitit's auto picks SLURM wherever srun is installed; ours asks the controller (sinfo) first."""
    from ppo_lightning.studies.runner import executor_cluster

    bin_ = tmp_path / "bin"
    bin_.mkdir()
    monkeypatch.setenv("PATH", str(bin_))
    assert executor_cluster("auto") == "local" and executor_cluster("slurm") == "slurm"  # no SLURM tools
    for tool, code in (("sbatch", 0), ("srun", 0), ("sinfo", 1)):
        (bin_ / tool).write_text(f"#!/bin/sh\nexit {code}\n")
        (bin_ / tool).chmod(0o755)
    assert executor_cluster("auto") == "local"  # tools, no controller
    assert "controller does not answer; running the jobs as local processes" in capsys.readouterr().out
    (bin_ / "sinfo").write_text("#!/bin/sh\necho up\n")
    assert executor_cluster("auto") == "slurm" and executor_cluster("local") == "local"


def test_a_shared_setting_an_arms_objective_ignores_is_a_warning_and_an_arms_own_is_refused(tmp_path, capsys):
    """The study's ``fit`` gives every arm kl_form sq_logratio: the KL arm uses it, the clip arm's
    objective ignores it: a warning names the arm, whose runs take the default (training the same);
    the KL arm keeps it. An arm's own setting its objective ignores stops the pre-flight in one line."""
    from ppo_lightning.algos.loss import LossSettings
    from ppo_lightning.run.preflight import PreflightError
    from ppo_lightning.studies import runner
    from ppo_lightning.studies.preflight import check_study

    defaults = LossSettings()
    assert runner.OBJECTIVE_DEFAULTS == {k: getattr(defaults, k) for k in runner.OBJECTIVE_DEFAULTS}
    arms = [{"name": "kl", "label": "KL", "fit": {"model.objective": "kl", "model.kl_beta": 0.5}},
            {"name": "clip", "label": "clip", "fit": {"model.objective": "clip"}}]
    comparisons = [{"claim": "x", "a": "kl", "b": "clip", "test": "difference"}]
    study = load_study(tiny(tmp_path, fit={**TINY_FIT, "model.kl_form": "sq_logratio"}, arms=arms, comparisons=comparisons))
    check_study(study)
    err = capsys.readouterr().err
    assert "arm clip's objective ignores model.kl_form 'sq_logratio' of the study's fit (shared by the arms)" in err
    assert "arm kl's" not in err
    spec = runner.cell_spec(study, "clip", "minatar:breakout", 0).argv()
    assert spec[spec.index("--model.kl_form") + 1] == "analytic"
    spec = runner.cell_spec(study, "kl", "minatar:breakout", 0).argv()
    assert spec[spec.index("--model.kl_form") + 1] == "sq_logratio"
    arms[1]["fit"]["model.kl_target"] = 0.02  # the clip arm's own
    study = load_study(tiny(tmp_path, arms=arms, comparisons=comparisons))
    with pytest.raises(PreflightError, match=r"arm clip on minatar:breakout: model.objective 'clip' ignores model.kl_target 0.02"):
        check_study(study)
