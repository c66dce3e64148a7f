"""A search-space file (YAML), validated before anything runs: every error is one line naming the field.

```yaml
tuning: breakout-lr-com               # name: the Optuna study, the MLflow experiment, the run folder
base: minatar/ppo_ewma   # the base config: a shipped name or a path (or a list applied in order)
fit: {scale: 16}                      # fit options every trial shares (dotted keys, as on the CLI)
env: minatar:breakout
frames: 500000                        # the budget of a trial, per seed, in environment frames
trials: 40                            # the search's size (trials of every worker together)
members: 16                           # S: members of one group (trials x seeds per trial)
seeds: {count: 2, first: 0}           # every trial trains these seeds; its objective is their mean
objective: {metric: auc, score: minatar}  # auc | final; raw | minatar (normalized return)
sampler: {name: tpe, seed: 0}         # tpe (constant liar: trials asked together differ) | random
pruner: {name: median, milestones: [125000, 250000]}  # none | median | percentile | halving
refill: true                          # a pruned or finished trial's slots take the next trial (default)
params:
  model.lr: {type: float, low: 0.0005, high: 0.01, log: true}
  model.proximal_com: {type: categorical, choices: [null, 4, 8, 16]}   # null: PPO (behavior anchor)
  data.num_minibatches: {type: categorical, choices: [4, 8]}           # splits trials into groups
```

Parameters a group member carries (`MEMBER_PARAMS`: the lr, the EWMA's center of mass or none,
the advantage span, Adam's betas, the clip range, the entropy and value coefficients, the KL beta,
gamma and GAE lambda) differ freely within a group; any other fit option is a
*group* parameter: trials that differ in it train in separate groups. A parameter is ``float``
or ``int`` (``low``, ``high``, optional ``log`` or ``step``) or ``categorical`` (``choices``; a
list as a choice, for ``model.adam_betas``). ``--config``, ``--trials``, ``--members`` and
``--frames`` of ``ppo-lightning tune`` replace the file's values before it is validated, and
``--no-refill`` sets ``refill: false`` (each group then trains its first trials only, their freed
slots idle). ``refill`` left out means on; a PPG group refills a slot where its next phase starts
(after an auxiliary phase), so that the new trial's phases are its single run's.
Paths are relative to the repository root (the folder holding ``pyproject.toml`` above the file),
else to the file.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ppo_lightning.core.members import BY_NAME, MEMBER_OPTIONS
from ppo_lightning.core.safety import UnsafeInput, env_dirname, load_yaml
from ppo_lightning.run.harness import RETURN_RANGES
from ppo_lightning.studies import fields
from ppo_lightning.studies.fields import resolve_ref
from ppo_lightning.studies.spec import find_root, merge_configs

# a fit option's name -> the member setting it is (declared in ppo_lightning.core.members.MEMBER_SETTINGS)
MEMBER_PARAMS = MEMBER_OPTIONS
KINDS = ("float", "int", "categorical")
METRICS = ("auc", "final")
SCORES = ("raw", "minatar")
SAMPLERS = ("tpe", "random")
PRUNERS = ("none", "median", "percentile", "halving")
OWNER = "the search"
# what the search gives every trial's run itself (`ppo_lightning.tuning.runner.train_group`): a file may
# state the same value, not another
FIXED_FIT = {
    "video_every": (None, "a search records no videos"),
    "mlflow.enabled": (False, "a trial's MLflow run is the search's own (made when the trial is told)"),
    "trainer.enable_checkpointing": (False, "a search's groups are not checkpointed"),
    "trainer.enable_progress_bar": (False, "a search's groups report progress per trial"),
}

# The search-space file's fields: (name, required, what it is). The parser accepts these and no others,
# and the Tuning guide's tables are generated from them (`schema_table`; tests/test_docs.py checks the page).
SPACE_FIELDS = (
    ("tuning", True, "the search's name (letters, digits, `_ . -`): its Optuna study, MLflow experiment and run "
                     "folder (`runs/tuning/<name>`)"),
    ("title", False, "a title for the summary (default: the name)"),
    ("base", True, "the base config: a shipped name (`minatar/ppo`) or a path, or a list applied in order "
                   "(`--config` replaces it)"),
    ("fit", False, "fit options every trial shares, dotted keys as on the command line (`model.lr: 0.004`), the "
                   "vocabulary of a study's `fit`"),
    ("env", True, "one environment id: any gymnasium id, `minatar:<game>`, `procgen:<game>`"),
    ("frames", True, "the budget of a trial, per seed, in environment frames (`--frames`)"),
    ("trials", True, "the search's size: trials of every worker together (`--trials`)"),
    ("members", True, "S, the members of one group: trials per group x `seeds.count` (`--members`)"),
    ("seeds", False, "`{count: N, first: S}`: every trial trains seeds S .. S + N - 1, its objective their mean "
                     "(default `{count: 1}`)"),
    ("objective", False, "what a trial maximizes (below; default `{metric: auc, score: raw}`)"),
    ("sampler", False, "Optuna's sampler (below; default `{name: tpe, seed: 0}`)"),
    ("pruner", False, "Optuna's pruner (below; default `{name: none}`)"),
    ("refill", False, "a pruned or finished trial's slots take the next trial (default `true`; `--no-refill`: false)"),
    ("params", True, "the searched fit options: `{fit option: distribution}` (below)"),
)
SEEDS_FIELDS = (
    ("count", False, "how many seeds (>= 1; default 1)"),
    ("first", False, "the first seed (default 0)"),
)
OBJECTIVE_FIELDS = (
    ("metric", False, "`auc` (default; the learning curve's mean over the budget) or `final` (its last 10%)"),
    ("score", False, "`raw` (default; returns) or `minatar` (MinAtar-normalized returns; a MinAtar env only)"),
)
SAMPLER_FIELDS = (
    ("name", False, "`tpe` (default; with constant liar: trials asked together differ) or `random`"),
    ("seed", False, "the sampler's seed (default 0)"),
)
PRUNER_FIELDS = (
    ("name", False, "`none` (default), `median`, `percentile` or `halving`"),
    ("milestones", False, "increasing frame counts below `frames` where a trial reports (default: frames / 4 and "
                          "frames / 2 with a pruner)"),
    ("n_startup_trials", False, "finished trials before `median` or `percentile` prunes (default 4)"),
    ("percentile", False, "`percentile`'s cut, in (0, 100) (default 25)"),
)
PARAM_FIELDS = (
    ("type", True, "`float`, `int` or `categorical`"),
    ("low", False, "`float` and `int`: the lowest value (required there)"),
    ("high", False, "`float` and `int`: the highest value (required there)"),
    ("log", False, "`float` and `int`: sample on a log scale (default false; needs low > 0)"),
    ("step", False, "`float` and `int`: the grid's step (not with `log`)"),
    ("choices", False, "`categorical`: the values (required there; `null` for `model.proximal_com` is PPO, pairs for "
                       "`model.adam_betas`)"),
)
SCHEMA = (("space file", SPACE_FIELDS), ("seeds", SEEDS_FIELDS), ("objective", OBJECTIVE_FIELDS),
          ("sampler", SAMPLER_FIELDS), ("pruner", PRUNER_FIELDS), ("params.<fit option>", PARAM_FIELDS))
FIELDS = tuple(n for n, _, _ in SPACE_FIELDS)


def schema_table() -> str:
    """The search-space file's schema as Markdown tables, one per part (`SCHEMA`): the Tuning guide's tables."""
    return fields.schema_table(SCHEMA)


class SpaceError(fields.FileError):
    """A search-space file that cannot run: the message is one line, naming the file and the field."""


@dataclass(frozen=True)
class Param:
    """One searched fit option and its distribution."""
    name: str
    kind: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple = ()

    @property
    def member(self) -> str | None:
        """The member setting this option is (a member carries it), else None (it splits groups)."""
        return MEMBER_PARAMS.get(self.name)

    def suggest(self, trial) -> Any:
        """The trial's value (Optuna's ``suggest_*``; a list choice travels as its JSON text)."""
        if self.kind == "float":
            return trial.suggest_float(self.name, self.low, self.high, log=self.log, step=self.step)
        if self.kind == "int":
            return trial.suggest_int(self.name, int(self.low), int(self.high), log=self.log, step=int(self.step or 1))
        encoded = [json.dumps(c) if isinstance(c, list) else c for c in self.choices]
        v = trial.suggest_categorical(self.name, encoded)
        return json.loads(v) if isinstance(v, str) and v.startswith("[") else v


@dataclass(frozen=True)
class Pruner:
    name: str = "none"
    milestones: tuple[int, ...] = ()
    n_startup_trials: int = 4
    percentile: float = 25.0

    def make(self):
        import optuna  # start-up cost: Optuna only where a search runs

        if self.name == "none":
            return optuna.pruners.NopPruner()
        if self.name == "median":
            return optuna.pruners.MedianPruner(n_startup_trials=self.n_startup_trials, n_warmup_steps=0)
        if self.name == "percentile":
            return optuna.pruners.PercentilePruner(self.percentile, n_startup_trials=self.n_startup_trials)
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=self.milestones[0], reduction_factor=2)


@dataclass(frozen=True)
class Space:
    path: Path
    name: str
    title: str
    base: tuple[str, ...]
    fit: dict[str, Any]
    env: str
    frames: int
    trials: int
    members: int
    seeds: tuple[int, ...]
    metric: str
    score: str
    sampler: str
    sampler_seed: int
    pruner: Pruner
    params: dict[str, Param]
    root: Path
    raw: dict = field(default_factory=dict, repr=False)
    refill: bool = True

    @property
    def trials_per_group(self) -> int:
        return self.members // len(self.seeds)

    def resolve(self, path: str | Path) -> Path:
        """A file the space names: a path or a shipped config name (`ppo_lightning.studies.spec.resolve_ref`)."""
        return resolve_ref(self.root, self.path, path)

    def base_config(self) -> dict:
        """The base configs merged (a later file's section values over an earlier one's)."""
        return merge_configs([self.resolve(c) for c in self.base])

    def setting(self, key: str, params: dict[str, Any] | None = None, default: Any = None) -> Any:
        """A fit option's value for a trial: its params, else the space's fit, else the base configs'."""
        if params and key in params:
            return params[key]
        if key in self.fit:
            return self.fit[key]
        section, _, name = key.partition(".")
        cfg = self.base_config()
        if not name:
            return cfg.get(section, default)
        return (cfg.get(section) or {}).get(name, default)


# the shared checks (`ppo_lightning.studies.fields`), raising this file's SpaceError
_need = functools.partial(fields.need, error=SpaceError)
_keys = functools.partial(fields.check_keys, error=SpaceError)
_int = fields.is_int
_num = fields.is_number


def _fit_key(key: Any, where: str, at: str) -> None:
    fields.check_fit_key(key, where, at, OWNER, SpaceError)


def _member_value_ok(setting: str, v: Any) -> bool:
    return BY_NAME[setting].valid(v)


def _param(name: Any, spec: Any, where: str) -> Param:
    at = f"params.{name}"
    _fit_key(name, where, at)
    _need(isinstance(spec, dict), where, f"{at}: a mapping {{type, low, high}} or {{type: categorical, choices}}, got {spec!r}")
    kind = spec.get("type")
    _need(kind in KINDS, where, f"{at}.type: one of {', '.join(KINDS)}, got {kind!r}")
    setting = MEMBER_PARAMS.get(name)
    if kind == "categorical":
        _keys(spec, ("type", "choices"), where, f"{at}.")
        choices = spec.get("choices")
        _need(isinstance(choices, list) and len(choices) >= 1, where, f"{at}.choices: a non-empty list, got {choices!r}")
        for c in choices:
            _need(c is None or isinstance(c, (bool, int, float, str, list)), where, f"{at}.choices: {c!r} is not a value")
            if setting is not None:
                _need(_member_value_ok(setting, c), where, f"{at}.choices: {c!r} is not a valid {setting}")
        _need(len({json.dumps(c) for c in choices}) == len(choices), where, f"{at}.choices: a value is listed twice")
        _need(name == "model.adam_betas" or not any(isinstance(c, list) for c in choices), where,
              f"{at}.choices: lists only for model.adam_betas")
        return Param(name, kind, choices=tuple(choices))
    _keys(spec, ("type", "low", "high", "log", "step"), where, f"{at}.")
    _need(name != "model.adam_betas", where, f"{at}: a pair of betas is searched as categorical choices")
    low, high, log, step = spec.get("low"), spec.get("high"), spec.get("log", False), spec.get("step")
    check = (lambda v: isinstance(v, int) and not isinstance(v, bool)) if kind == "int" else _num
    _need(check(low), where, f"{at}.low: {'an integer' if kind == 'int' else 'a number'}, got {low!r}")
    _need(check(high), where, f"{at}.high: {'an integer' if kind == 'int' else 'a number'}, got {high!r}")
    _need(low < high, where, f"{at}: low ({low}) must be below high ({high})")
    _need(isinstance(log, bool), where, f"{at}.log: true or false, got {log!r}")
    _need(not log or low > 0, where, f"{at}.log: a log scale needs low > 0, got {low}")
    _need(step is None or (check(step) and step > 0), where, f"{at}.step: a positive {kind}, got {step!r}")
    _need(not (log and step is not None), where, f"{at}: log and step exclude each other (Optuna)")
    if setting is not None:
        for end, v in (("low", low), ("high", high)):
            _need(_member_value_ok(setting, v), where, f"{at}.{end}: {v!r} is not a valid {setting}")
    return Param(name, kind, float(low), float(high), log, None if step is None else float(step))


def parse_space(data: Any, path: Path) -> Space:
    """A `Space` from a loaded YAML mapping (``path``: where it came from, for messages and paths)."""
    where = str(path)
    _need(isinstance(data, dict), where, "a search-space file is a YAML mapping")
    _keys(data, FIELDS, where)
    for required in ("tuning", "base", "env", "frames", "trials", "members", "params"):
        _need(data.get(required) is not None, where, f"{required}: missing")
    name = fields.check_name(data["tuning"], where, "tuning", SpaceError)  # it names the run root
    root = find_root(path.resolve())
    base = fields.config_list(data["base"], root, path, where, "base", SpaceError)
    env = data["env"]
    _need(isinstance(env, str) and env != "", where, f"env: an environment id (a gymnasium id, procgen:<game> or minatar:<game>), got {env!r}")
    fields.check_safe(lambda: env_dirname(env, "env"), where, SpaceError)
    for key in ("frames", "trials", "members"):
        _need(_int(data[key], 1), where, f"{key}: a positive integer, got {data[key]!r}")
    seeds = fields.seed_range(data.get("seeds") or {}, where, SpaceError, default_count=1)
    count = len(seeds)
    members = data["members"]
    _need(members % count == 0, where, f"members: {members} members do not hold whole trials of {count} seeds "
                                        f"(seeds.count); use a multiple of {count}")
    objective = data.get("objective") or {}
    _need(isinstance(objective, dict), where, f"objective: a mapping {{metric, score}}, got {objective!r}")
    _keys(objective, tuple(n for n, _, _ in OBJECTIVE_FIELDS), where, "objective.")
    metric, score = objective.get("metric", "auc"), objective.get("score", "raw")
    _need(metric in METRICS, where, f"objective.metric: one of {', '.join(METRICS)}, got {metric!r}")
    _need(score in SCORES, where, f"objective.score: one of {', '.join(SCORES)}, got {score!r}")
    if score == "minatar":
        game = env.split(":", 1)[1] if env.startswith("minatar:") else None
        _need(game in RETURN_RANGES, where, f"objective.score: minatar normalizes MinAtar games, env is {env!r}")
    sampler = data.get("sampler") or {}
    _need(isinstance(sampler, dict), where, f"sampler: a mapping {{name, seed}}, got {sampler!r}")
    _keys(sampler, tuple(n for n, _, _ in SAMPLER_FIELDS), where, "sampler.")
    sname, sseed = sampler.get("name", "tpe"), sampler.get("seed", 0)
    _need(sname in SAMPLERS, where, f"sampler.name: one of {', '.join(SAMPLERS)}, got {sname!r}")
    _need(_int(sseed, 0), where, f"sampler.seed: an integer >= 0, got {sseed!r}")
    pr = data.get("pruner") or {}
    _need(isinstance(pr, dict), where, f"pruner: a mapping {{name, milestones}}, got {pr!r}")
    _keys(pr, tuple(n for n, _, _ in PRUNER_FIELDS), where, "pruner.")
    pname = pr.get("name", "none")
    _need(pname in PRUNERS, where, f"pruner.name: one of {', '.join(PRUNERS)}, got {pname!r}")
    frames = data["frames"]
    milestones = pr.get("milestones", [frames // 4, frames // 2] if pname != "none" else [])
    _need(isinstance(milestones, list) and all(_int(m, 1) and m < frames for m in milestones)
          and milestones == sorted(set(milestones)), where,
          f"pruner.milestones: increasing frame counts below frames ({frames}), got {milestones!r}")
    _need(pname == "none" or milestones, where, f"pruner.milestones: pruner {pname} needs at least one milestone")
    startup = pr.get("n_startup_trials", 4)
    _need(_int(startup, 0), where, f"pruner.n_startup_trials: an integer >= 0, got {startup!r}")
    pct = pr.get("percentile", 25.0)
    _need(_num(pct) and 0 < pct < 100, where, f"pruner.percentile: a number in (0, 100), got {pct!r}")
    refill = data.get("refill")
    _need(refill is None or isinstance(refill, bool), where, f"refill: true or false, got {refill!r}")
    fit = fields.fit_options(data.get("fit"), where, "fit", OWNER, SpaceError, FIXED_FIT)
    params_in = data["params"]
    _need(isinstance(params_in, dict) and params_in, where, "params: a non-empty mapping {fit option: distribution}")
    params = {}
    for pname_, spec in params_in.items():
        params[pname_] = _param(pname_, spec, where)
        _need(pname_ not in fit, where, f"params.{pname_}: also set in fit; search it or fix it, not both")
    space = Space(path=path, name=name, title=str(data.get("title") or name), base=tuple(base), fit=dict(fit), env=env,
                  frames=frames, trials=data["trials"], members=members, seeds=seeds,
                  metric=metric, score=score, sampler=sname, sampler_seed=sseed,
                  pruner=Pruner(pname, tuple(milestones), startup, float(pct)), params=params, root=root, raw=dict(data),
                  refill=refill is not False)
    if "model.proximal_com" in params:
        _need(space.setting("model.decoupled") is True, where,
              "params.model.proximal_com: the EWMA is the decoupled objective's anchor; set model.decoupled: true "
              "(in fit or the base; null among the choices is PPO)")
    return space


def load_space(path: str | Path, overrides: dict[str, Any] | None = None) -> Space:
    """Read and validate a search-space file (`SpaceError`, one line, on the first bad field);
    ``overrides`` (``base``, ``trials``, ``members``, ``frames``: the command's options) replace its values first."""
    path = Path(path)
    if not path.exists():
        raise SpaceError(f"{path}: no such search-space file")
    try:
        data = load_yaml(path)  # bounded: an alias bomb is refused in one line
    except UnsafeInput as err:
        raise SpaceError(str(err)) from None
    if isinstance(data, dict):
        data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        return parse_space(data, path)
    except UnsafeInput as err:  # a base config that is a bomb or not a mapping
        raise SpaceError(str(err)) from None
