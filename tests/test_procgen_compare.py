"""experiments/procgen/compare.py: each run is written when it ends, a rerun skips the finished runs,
and two variants get the CI of their difference (the fits themselves are stubbed: the driver's
bookkeeping is under test, not Procgen)."""

import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments" / "procgen"))
sys.path.insert(0, str(ROOT / "experiments"))


def test_compare_writes_each_run_and_a_rerun_skips_finished_ones(tmp_path, monkeypatch, capsys):
    import compare

    calls = []

    def fake_run(args, *, run_name, **kwargs):
        calls.append(run_name)
        if len(calls) == 3:  # the sweep dies in its third run
            raise KeyboardInterrupt
        level = 0.1 if "32-true" in args else 0.2
        curve = [(1000.0, level), (2000.0, 2 * level)]
        return {"run_id": run_name, "curve": curve, "final": 2 * level, "frames": 2000, "wall_s": 1.0}

    monkeypatch.setattr(compare, "run", fake_run)
    argv = ["--name", "p", "--seeds", "2", "--frames", "2000", "--out", str(tmp_path),
            "--variant", "bf16=--trainer.precision bf16-mixed", "--variant", "fp32=--trainer.precision 32-true"]
    try:
        compare.main(argv)
    except KeyboardInterrupt:
        pass
    rows = list(csv.DictReader(open(tmp_path / "p.csv")))
    assert [(r["variant"], r["seed"]) for r in rows] == [("bf16", "0"), ("fp32", "0")]  # seed by seed, both variants
    assert float(rows[0]["auc_normalized_return"]) == 0.2  # step curve: 0.2 from 0 to 2000 frames, 0.4 after
    compare.main(argv)  # resumed: only seed 1's two runs train
    assert calls == ["bf16-s0", "fp32-s0", "bf16-s1", "bf16-s1", "fp32-s1"]
    rows = list(csv.DictReader(open(tmp_path / "p.csv")))
    assert len(rows) == 4 and len(list(csv.DictReader(open(tmp_path / "p_curves.csv")))) == 8
    out = capsys.readouterr().out
    assert "bf16 - fp32, final: +0.2000" in out and (tmp_path / "p.png").exists()
