"""A study file (YAML), validated before anything runs: every error is one line naming the field.

```yaml
study: fig4-500k                      # name: MLflow experiment, record files, plots
title: "Fig. 4 at 500k frames"        # optional, for the report
base: minatar/ppo    # the base config: a shipped name or a path (or a list applied in order)
fit: {model.max_importance_ratio: 100}  # fit options every arm shares (dotted keys, as on the CLI)
envs: [minatar:space_invaders, minatar:asterix]
seeds: {count: 8, first: 0}
frames: 500000                        # the budget per run, in environment frames
score: minatar-500k                   # how returns are normalized: raw | minatar | minatar-500k
pool: [cpu]                           # factors a verdict may pool cells across: cpu, precision
target_half_width: 0.05               # the CI half-width a verdict is resolved at, in the score's units
arms:
  - {name: ppo, label: "PPO", fit: {model.lr: 0.004}}
  - {name: ppo_ewma, label: "PPO-EWMA (COM 8)", fit: {model.lr: 0.004, model.decoupled: true, model.proximal_com: 8}}
comparisons:
  - {claim: "PPO-EWMA learns faster than PPO", a: ppo_ewma, b: ppo, test: difference, metric: auc}
  - {claim: "PPG-EWMA equals PPG", a: ppg_ewma, b: ppg, test: equivalence, margin: 0.02, metric: [auc, final]}
  - {claim: "tuned is as good as hand-picked", a: tuned, b: hand, test: noninferiority, margin: 0.05, metric: auc}
selection: "lr 4e-3 was chosen for PPO-EWMA on seeds 0-7 (minatar_lr_500k.yaml)"  # optional: what these seeds chose
confirm:                              # optional: the same claims on seeds no selection used
  study: minatar_fig4_500k_fresh.yaml # a study file (or a list) with arms of the same names and other seeds
records:                              # optional: committed records of the experiment scripts, read as cells
  dir: experiments/results/minatar
  figure: ewma500k                    # <figure>_runs.csv / _curves.csv; an arm's rows are its name's
  arms: {ppo_ewma: [lr500k/c1_lr8x, ewma500k/ppo_ewma_lr8x]}  # or other figures' arms, in order
  committed: ewma500k_summary.csv     # its committed verdicts, compared in the report
```

A study whose ``seeds`` chose a setting (an lr, a COM: picked where it did best) states so in
``selection``, and names in ``confirm.study`` the study (or studies: e.g. the same fresh seeds in
32-true and in bf16-mixed) that runs the same arms on seeds no selection used: its own file, run by
``study run`` like any other, its seeds disjoint from these. The report gives every claim on every
seed set; a claim is a headline only where it holds on the fresh seeds.

``score: random-best`` normalizes per environment as the PPO paper's Table 1: 0 the random policy's
return (``score_ref.random``: a CSV of ``env,return``), 1 the best of ``score_ref.best_of``'s arms
(the mean over its seeds of ``score_ref.metric``). An arm may carry ``paper:`` (its published value
on that score), shown beside its measured one.

An arm may add config files after the base (``configs: [minatar/ppg]``). A
comparison may restrict the environments it pools (``envs``) and name its figure (``figure``).
Paths are relative to the repository root (the folder holding ``pyproject.toml`` above the file),
else to the study file.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ppo_lightning.core.configs import read_config
from ppo_lightning.core.safety import UnsafeInput, env_dirname, load_yaml, read_csv
from ppo_lightning.studies import fields
from ppo_lightning.studies.fields import resolve_ref

SCORES = ("raw", "minatar", "minatar-500k", "random-best")
# What a score is measured in, as the report's headers name it.
SCORE_UNITS = {"raw": "raw return", "minatar": "normalized score", "minatar-500k": "normalized score",
               "random-best": "normalized score"}
DEFAULT_TARGET_HALF_WIDTH = 0.05  # of a normalized score (0 to 1); a raw score has no default
POOLABLE = ("cpu", "precision")
TESTS = ("difference", "equivalence", "noninferiority")
METRICS = ("auc", "final", "last100")  # last100: mean return of the run's last 100 episodes (the PPO paper's score)


# The study file's fields: (name, required, what it is). The parser accepts these and no others, and the
# Studies guide's schema tables are generated from them (`schema_table`; tests/test_docs.py checks the page).
STUDY_FIELDS = (
    ("study", True, "the study's name (letters, digits, `_ . -`): its MLflow experiment, run folder, record and report files"),
    ("title", False, "a title for the report (default: the name)"),
    ("base", True, "the base config: a shipped name (`minatar/ppo`) or a path, or a list applied in order"),
    ("fit", False, "fit options every arm shares, dotted keys as on the command line (`model.lr: 0.004`)"),
    ("envs", True, "environment ids: any gymnasium id, `minatar:<game>`, `procgen:<game>`"),
    ("seeds", True, "`{count: N, first: S}`: seeds S .. S + N - 1 of every arm on every env"),
    ("frames", True, "the budget of every run, in environment frames"),
    ("score", False, "how returns are normalized: `raw` (default), `minatar`, `minatar-500k`, `random-best` (the PPO "
              "paper's Table 1: per env, the random policy 0 and the best of `score_ref.best_of` 1)"),
    ("score_ref", False, "`score: random-best`'s references (below)"),
    ("pool", False, "factors a verdict may pool cells across: `cpu`, `precision` (default: none)"),
    ("target_half_width", False, "the CI half-width the rows are checked against, in the units of `score`: a wider CI "
                          "says so in its row (default 0.05 of a normalized score; required with `score: raw` where "
                          "the file compares arms: a return's scale is the environment's)"),
    ("arms", True, "the settings compared: a list of arms (below)"),
    ("comparisons", False, "the claims tested: a list of comparisons (below)"),
    ("records", False, "committed records of earlier runs read as cells (below)"),
    ("selection", False, "what these seeds chose, in words (an lr picked where it did best on them): the report says it"),
    ("confirm", False, "the studies that run the same claims on seeds no selection used (below)"),
)
SEEDS_FIELDS = (
    ("count", True, "how many seeds (>= 1)"),
    ("first", False, "the first seed (default 0)"),
)
ARM_FIELDS = (
    ("name", True, "the arm's name (letters, digits, `_ . -`): record files and comparisons use it"),
    ("label", True, "what plots and tables show"),
    ("fit", False, "the arm's own fit options (dotted keys), over the study's `fit`"),
    ("configs", False, "config files (or shipped names) applied after the base, e.g. `[minatar/ppg]`"),
    ("paper", False, "the arm's published value on the study's score, shown beside the measured one"),
)
COMPARISON_FIELDS = (
    ("claim", True, "the hypothesis in words"),
    ("a", True, "an arm"),
    ("b", True, "the arm it is compared with (the effect is a - b)"),
    ("test", False, "`difference` (default; the sign the 95% CI resolves), `equivalence` (TOST: abs(a - b) < margin), "
                    "`noninferiority` (a - b > -margin)"),
    ("margin", False, "equivalence and noninferiority: the difference that counts as equal (equivalence) or how much worse a may be"),
    ("metric", False, "`auc` (default; normalized return averaged over the run), `final` (its last 10%), `last100` "
               "(the mean return of its last 100 episodes), or a list"),
    ("envs", False, "the study's envs this comparison pools (default: all)"),
    ("figure", False, "the paper's figure the claim comes from, for the report"),
    ("pool", False, "factors this comparison pools across besides the study's (`precision` where that is its point)"),
)
RECORDS_FIELDS = (
    ("dir", True, "the folder of committed CSVs"),
    ("figure", True, "the records' figure: `<figure>_runs.csv` and `_curves.csv` hold the cells"),
    ("arms", False, "an arm's records under other names: `{arm: [FIGURE/ARM, ...]}`, in order"),
    ("committed", False, "a CSV of committed verdicts the report compares with"),
)
CONFIRM_FIELDS = (
    ("study", True, "a study file, or a list: the same arm names on other seeds (disjoint from these), the same score; "
                    "each its own study, run by `study run`. The report gives every claim on every seed set"),
)
SCORE_REF_FIELDS = (
    ("random", True, "a CSV of `env,return`: the random policy's return per env (the score's 0)"),
    ("best_of", True, "the arms whose best mean (over their seeds) sets each env's 1"),
    ("metric", False, "the statistic normalized and compared: `last100` (default), `final` or `auc`"),
)
SCHEMA = (("study file", STUDY_FIELDS), ("seeds", SEEDS_FIELDS), ("arms[i]", ARM_FIELDS),
          ("comparisons[i]", COMPARISON_FIELDS), ("records", RECORDS_FIELDS), ("confirm", CONFIRM_FIELDS),
          ("score_ref", SCORE_REF_FIELDS))


def _names(fields) -> tuple[str, ...]:
    return tuple(f[0] for f in fields)


def schema_table() -> str:
    """The study file's schema as Markdown tables, one per part (`SCHEMA`): the Studies guide's tables."""
    return fields.schema_table(SCHEMA)


class StudyError(fields.FileError):
    """A study file that cannot run: the message is one line, naming the file and the field."""


@dataclass(frozen=True)
class Arm:
    name: str
    label: str
    fit: dict[str, Any] = field(default_factory=dict)
    configs: tuple[str, ...] = ()
    paper: float | None = None  # the published value of this arm on the study's score (Table 1's)


@dataclass(frozen=True)
class Comparison:
    claim: str
    a: str
    b: str
    test: str = "difference"
    metrics: tuple[str, ...] = ("auc",)
    margin: float | None = None
    envs: tuple[str, ...] | None = None
    figure: str | None = None
    pool: tuple[str, ...] = ()  # factors this comparison pools across besides the study's (precision: its point)


@dataclass(frozen=True)
class Records:
    dir: Path
    figure: str
    arms: dict[str, tuple[tuple[str, str], ...]]
    committed: Path | None = None


@dataclass(frozen=True)
class Confirm:
    """The studies that run the same claims on seeds no selection used (``confirm.study``)."""
    paths: tuple[Path, ...]


@dataclass(frozen=True)
class ScoreRef:
    """``score: random-best``: per env, 0 is ``random[env]``, 1 the best mean ``metric`` of ``best_of``."""
    random: dict[str, float]
    random_source: Path
    best_of: tuple[str, ...]
    metric: str


@dataclass(frozen=True)
class Study:
    path: Path
    name: str
    title: str
    base: tuple[str, ...]
    fit: dict[str, Any]
    envs: tuple[str, ...]
    seeds: tuple[int, ...]
    frames: int
    score: str
    pool: tuple[str, ...]
    target_half_width: float | None  # in the units of `score` (None: a raw-score study that compares nothing)
    arms: dict[str, Arm]
    comparisons: tuple[Comparison, ...]
    records: Records | None
    root: Path
    selection: str = ""
    confirm: Confirm | None = None
    score_ref: ScoreRef | None = None

    def confirmation(self) -> "list[Study]":
        """The confirming studies (`load_study` of each ``confirm.study``), in the file's order."""
        return [] if self.confirm is None else [load_study(p) for p in self.confirm.paths]

    @property
    def units(self) -> str:
        """What the study's scores are measured in (`SCORE_UNITS`): "raw return", "normalized score"."""
        return SCORE_UNITS[self.score]

    @property
    def seed_range(self) -> str:
        """The seeds as a reader writes them: '0-7', or '0, 3, 5'."""
        s = list(self.seeds)
        return f"{s[0]}-{s[-1]}" if s == list(range(s[0], s[0] + len(s))) and len(s) > 1 else ", ".join(map(str, s))

    def arm(self, name: str) -> Arm:
        return self.arms[name]

    def cells(self) -> list[tuple[str, str, int]]:
        """Every (arm, env, seed) the study asks for."""
        return [(a, e, s) for e in self.envs for a in self.arms for s in self.seeds]

    def over_envs(self, envs: tuple[str, ...]) -> Study:
        """The study as if its file listed only ``envs`` (a subset of its own): each comparison pools
        its envs among them, and a comparison with none of them left is dropped. For an interim look
        at a study whose other envs are still running (``study report --envs``); its claims are the
        whole file's."""
        unknown = [e for e in envs if e not in self.envs]
        if unknown or not envs:
            raise ValueError(f"--envs: {', '.join(unknown) or 'no env'} not among the study's envs ({', '.join(self.envs)})")
        comparisons = []
        for c in self.comparisons:
            kept = tuple(e for e in (c.envs or self.envs) if e in envs)
            if kept:
                comparisons.append(replace(c, envs=None if c.envs is None else kept))
        return replace(self, envs=tuple(e for e in self.envs if e in envs), comparisons=tuple(comparisons))

    def resolve(self, path: str | Path) -> Path:
        """A file the study names (`resolve_ref`)."""
        return resolve_ref(self.root, self.path, path)

    @property
    def cells_csv(self) -> Path:
        return self.path.with_name(f"{self.path.stem}.cells.csv")

    @property
    def curves_csv(self) -> Path:
        return self.path.with_name(f"{self.path.stem}.curves.csv")


def find_root(path: Path) -> Path:
    """The repository root above ``path`` (the folder with pyproject.toml), else its folder."""
    for parent in [path.parent, *path.parents]:
        if (parent / "pyproject.toml").exists():
            return parent
    return path.parent


# the shared checks (`ppo_lightning.studies.fields`), raising this file's StudyError
_need = functools.partial(fields.need, error=StudyError)
_keys = functools.partial(fields.check_keys, error=StudyError)
_safe = functools.partial(fields.check_safe, error=StudyError)
OWNER = "the study"


def _str_list(value: Any, where: str, field_name: str) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    _need(isinstance(items, list) and items and all(isinstance(x, str) and x for x in items), where,
          f"{field_name} must be a non-empty string or list of strings, got {value!r}")
    return tuple(items)


def _fit(value: Any, where: str, field_name: str) -> dict[str, Any]:
    return fields.fit_options(value, where, field_name, OWNER, StudyError)


def merge_configs(paths: list[Path]) -> dict:
    """YAML configs merged in order (a later file's section values over an earlier one's)."""
    merged: dict = {}
    for path in paths:
        data = read_config(path)  # bounded, with the configs it names: a shared study file's configs are data too
        for section, values in data.items():
            if isinstance(values, dict):
                merged.setdefault(section, {}).update(values)
            else:
                merged[section] = values
    return merged


def parse_study(data: Any, path: Path) -> Study:
    """A `Study` from a loaded YAML mapping (``path``: where it came from, for messages and paths)."""
    where = str(path)
    _need(isinstance(data, dict), where, "a study file is a YAML mapping")
    _keys(data, _names(STUDY_FIELDS), where)
    for required in (n for n, req, _ in STUDY_FIELDS if req):
        _need(required in data, where, f"{required}: missing")
    name = fields.check_name(data["study"], where, "study", StudyError)  # it names the run root and the records
    root = find_root(path.resolve())
    base = fields.config_list(data["base"], root, path, where, "base", StudyError)
    envs = _str_list(data["envs"], where, "envs")
    _need(len(set(envs)) == len(envs), where, "envs: listed twice")
    for e in envs:  # an env becomes part of lock, folder and record names (':' as '-')
        _safe(lambda: env_dirname(e, "envs"), where)
    seed_tuple = fields.seed_range(data["seeds"], where, StudyError)
    frames = data["frames"]
    _need(isinstance(frames, int) and not isinstance(frames, bool) and frames > 0, where, f"frames: a positive integer, got {frames!r}")
    score = data.get("score", "raw")
    _need(score in SCORES, where, f"score: one of {', '.join(SCORES)}, got {score!r}")
    pool = tuple(data.get("pool") or ())
    for p in pool:
        _need(p in POOLABLE, where, f"pool: {p!r} is not a factor; pool across {', '.join(POOLABLE)}")
    target = data.get("target_half_width")
    _need(target is None or isinstance(target, (int, float)) and not isinstance(target, bool) and target > 0, where,
          f"target_half_width: a positive number, got {target!r}")
    shared = _fit(data.get("fit"), where, "fit")

    arms: dict[str, Arm] = {}
    _need(isinstance(data["arms"], list) and data["arms"], where, "arms: a non-empty list")
    for i, a in enumerate(data["arms"]):
        at = f"arms[{i}]"
        _need(isinstance(a, dict), where, f"{at}: a mapping {{name, label, fit}}, got {a!r}")
        _keys(a, _names(ARM_FIELDS), where, f"{at}.")
        n = a.get("name")
        fields.check_name(n, where, f"{at}.name", StudyError, max_len=64)  # arm__env__seed.json stays a file name
        _need(n not in arms, where, f"{at}.name: {n!r} is used twice")
        label = a.get("label")
        _need(isinstance(label, str) and label.strip() != "", where, f"{at}.label ({n}): the label plots and tables show, missing")
        configs = fields.config_list(a["configs"], root, path, where, f"{at}.configs", StudyError) if "configs" in a else ()
        paper = a.get("paper")
        _need(paper is None or (isinstance(paper, (int, float)) and not isinstance(paper, bool)), where,
              f"{at}.paper ({n}): the published value, a number, got {paper!r}")
        arms[n] = Arm(n, label, _fit(a.get("fit"), where, f"{at}.fit ({n})"), configs, None if paper is None else float(paper))

    comparisons = []
    for i, c in enumerate(data.get("comparisons") or []):
        at = f"comparisons[{i}]"
        _need(isinstance(c, dict), where, f"{at}: a mapping {{claim, a, b, test, metric}}, got {c!r}")
        _keys(c, _names(COMPARISON_FIELDS), where, f"{at}.")
        _need(isinstance(c.get("claim"), str) and c["claim"].strip() != "", where, f"{at}.claim: the hypothesis in words, missing")
        for side in ("a", "b"):
            _need(c.get(side) in arms, where, f"{at}.{side}: {c.get(side)!r} is not an arm; arms: {', '.join(arms)}")
        _need(c["a"] != c["b"], where, f"{at}: a and b are the same arm")
        test = c.get("test", "difference")
        _need(test in TESTS, where, f"{at}.test: one of {', '.join(TESTS)}, got {test!r}")
        margin = c.get("margin")
        if test in ("equivalence", "noninferiority"):
            what = "the largest difference that counts as equal" if test == "equivalence" else "how much worse a may be and still count"
            _need(isinstance(margin, (int, float)) and not isinstance(margin, bool) and margin > 0 and math.isfinite(margin),
                  where, f"{at}.margin: {'an equivalence' if test == 'equivalence' else 'a non-inferiority test'} needs a positive margin ({what}), got {margin!r}")
        else:
            _need(margin is None, where, f"{at}.margin: only an equivalence or a non-inferiority test has a margin")
        metrics = c.get("metric", "auc")
        metrics = (metrics,) if isinstance(metrics, str) else tuple(metrics) if isinstance(metrics, list) else (metrics,)
        for m in metrics:
            _need(m in METRICS, where, f"{at}.metric: one of {', '.join(METRICS)}, got {m!r}")
        cenvs = None
        if "envs" in c:
            cenvs = _str_list(c["envs"], where, f"{at}.envs")
            for e in cenvs:
                _need(e in envs, where, f"{at}.envs: {e} is not one of the study's envs")
        cpool = tuple(c.get("pool") or ())
        for p in cpool:
            _need(p in POOLABLE, where, f"{at}.pool: {p!r} is not a factor; pool across {', '.join(POOLABLE)}")
        comparisons.append(Comparison(c["claim"], c["a"], c["b"], test, metrics,
                                      None if margin is None else float(margin), cenvs, c.get("figure"), tuple(pool) + cpool))

    records = None
    if data.get("records") is not None:
        r = data["records"]
        _need(isinstance(r, dict), where, "records: a mapping {dir, arms, committed}")
        _keys(r, _names(RECORDS_FIELDS), where, "records.")
        _need(isinstance(r.get("figure"), str), where, "records.figure: the records' figure whose CSVs hold the cells, missing")
        _need(isinstance(r.get("dir"), str), where, "records.dir: the folder of the committed CSVs, missing")
        rdir = (root / r["dir"]) if (root / r["dir"]).exists() else path.parent / r["dir"]
        _need(rdir.is_dir(), where, f"records.dir: {r['dir']} is not a folder")
        mapping = {}
        for arm, sources in (r.get("arms") or {}).items():
            _need(arm in arms, where, f"records.arms.{arm}: not an arm of the study")
            srcs = _str_list(sources, where, f"records.arms.{arm}")
            for s in srcs:
                _need(s.count("/") == 1, where, f"records.arms.{arm}: {s!r} is not FIGURE/ARM")
            mapping[arm] = tuple(tuple(s.split("/")) for s in srcs)
        committed = None
        if r.get("committed"):
            committed = rdir / r["committed"]
            _need(committed.exists(), where, f"records.committed: {committed} does not exist")
        _need((rdir / f"{r['figure']}_runs.csv").exists(), where, f"records.figure: no {r['figure']}_runs.csv in {r['dir']}")
        records = Records(rdir, r["figure"], mapping, committed)

    selection = data.get("selection") or ""
    _need(isinstance(selection, str), where, f"selection: what these seeds chose, in words, got {selection!r}")
    confirm = None
    if data.get("confirm") is not None:
        cf = data["confirm"]
        _need(isinstance(cf, dict), where, "confirm: a mapping {study: FILE or [FILE, ...]} (the studies on seeds no selection used)")
        _keys(cf, _names(CONFIRM_FIELDS), where, "confirm.")
        refs = _str_list(cf.get("study"), where, "confirm.study")
        paths = []
        for ref in refs:
            cpath = resolve_ref(root, path, ref)
            _need(cpath.is_file(), where, f"confirm.study: {ref} is not a file")
            _need(cpath.resolve() != path.resolve(), where, "confirm.study: a study cannot confirm itself")
            try:
                other = load_study(cpath)
            except StudyError as err:
                raise StudyError(f"{where}: confirm.study: {err}") from None
            _need(other.score == score, where, f"confirm.study: {ref} scores {other.score}, this study {score}: the same claims need the same score")
            overlap = sorted(set(other.seeds) & set(seed_tuple))
            _need(not overlap, where, f"confirm.study: seeds {overlap} are also this study's (selection) seeds; fresh seeds must be others")
            confirmable = [c for c in comparisons if c.a in other.arms and c.b in other.arms]
            _need(bool(confirmable), where, f"confirm.study: {ref} has the arms of none of the comparisons (same names)")
            paths.append(cpath)
        _need(len(set(paths)) == len(paths), where, "confirm.study: listed twice")
        confirm = Confirm(tuple(paths))
    score_ref = None
    if target is None:  # in the units of the score: a normalized score's default, a raw one's stated
        _need(score != "raw" or not comparisons, where,
              "target_half_width: required with score: raw where the file compares arms (the CI half-width a verdict "
              "is resolved at, in raw return units: e.g. 20 for CartPole-v1's returns of up to 500)")
        target = None if score == "raw" else DEFAULT_TARGET_HALF_WIDTH
    if score == "random-best":
        sr = data.get("score_ref")
        _need(isinstance(sr, dict), where, "score_ref: score random-best needs {random: CSV, best_of: [arms], metric}")
        _keys(sr, _names(SCORE_REF_FIELDS), where, "score_ref.")
        _need(isinstance(sr.get("random"), str), where, "score_ref.random: a CSV of env,return (the random policy's), missing")
        rpath = resolve_ref(root, path, sr["random"])
        _need(rpath.is_file(), where, f"score_ref.random: {sr['random']} is not a file")
        try:
            rows = read_csv(rpath, f"score_ref.random: {sr['random']}")
        except UnsafeInput as err:
            raise StudyError(f"{where}: {err}") from None
        _need(rows and {"env", "return"} <= set(rows[0]), where, f"score_ref.random: {sr['random']} needs columns env, return")
        random = {r["env"]: float(r["return"]) for r in rows}
        for e in envs:
            _need(e in random, where, f"score_ref.random: no random-policy return for {e} in {sr['random']}")
        best_of = _str_list(sr.get("best_of"), where, "score_ref.best_of")
        for b in best_of:
            _need(b in arms, where, f"score_ref.best_of: {b!r} is not an arm")
        metric = sr.get("metric", "last100")
        _need(metric in METRICS, where, f"score_ref.metric: one of {', '.join(METRICS)}, got {metric!r}")
        score_ref = ScoreRef(random, rpath, best_of, metric)
    else:
        _need("score_ref" not in data, where, "score_ref: only score random-best has one")
    return Study(path=path, name=name, title=str(data.get("title") or name), base=base, fit=shared, envs=envs,
                 seeds=seed_tuple, frames=frames, score=score, pool=pool,
                 target_half_width=None if target is None else float(target), arms=arms, comparisons=tuple(comparisons), records=records, root=root,
                 selection=selection.strip(), confirm=confirm, score_ref=score_ref)


def load_study(path: str | Path) -> Study:
    """Read and validate a study file (`StudyError`, one line, on the first bad field)."""
    path = Path(path)
    if not path.exists():
        raise StudyError(f"{path}: no such study file")
    try:
        data = load_yaml(path)  # bounded: an alias bomb is refused in one line
    except UnsafeInput as err:
        raise StudyError(str(err)) from None
    return parse_study(data, path)
