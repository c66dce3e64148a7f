"""ppo_lightning.run.resume without training: what a command line gives, dotted dict entries, and how a
resume decides each setting."""

import pytest

from ppo_lightning.run import resume as R


def test_explicit_settings_are_the_command_lines_own():
    argv = ["fit", "--config", "cartpole/ppo", "--model.objective_args.c", "2", "--model", "my.Mod", "--model.init_args.lr=1e-3",
            "--data.total_frames", "10", "--seeds", "2", "--model.help", "X"]
    assert R.explicit_settings(argv) == {"model.objective_args", "model.class_path", "model.lr", "data.total_frames",
                                         "data.num_seeds"}


def test_dotted_entries_change_one_entry_and_keep_the_others():
    argv, dotted = R.split_dotted(["fit", "--model.objective_args.c", "3", "--model.loss.init_args.delta=0.5",
                                   "--model.network.hidden", "16", "--model.clip_eps", "0.1"])
    assert argv == ["fit", "--model.network.hidden", "16", "--model.clip_eps", "0.1"]
    model = {"objective_args": {"c": 2.5, "d": 1}, "loss": {"class_path": "my.Loss"}}
    R.apply_dotted(model, dotted)
    assert model == {"objective_args": {"c": 3, "d": 1}, "loss": {"class_path": "my.Loss", "init_args": {"delta": 0.5}}}
    with pytest.raises(ValueError, match="needs a value"):
        R.split_dotted(["--model.schedules.lr"])


def test_reconcile_keeps_the_checkpoints_refuses_changes_and_allows_declared_ones():
    saved = {"model.clip_eps": 0.1, "model.max_bad_steps": 100, "model.ppg": {"n_pi": 3, "aux_lr": 5e-4},
             "data.total_frames": 128, "data.gamma": 0.99, "data.num_threads": 1}
    before = {"model.clip_eps": 0.2, "model.max_bad_steps": 100, "model.ppg": {"n_pi": 3}, "data.total_frames": 100_000,
              "data.gamma": 0.99, "data.num_threads": 2}
    values, kept, changed = R.reconcile(before, saved, set(), set(), set(R.MODEL_SAFE))
    assert values == {"model.clip_eps": 0.1, "model.ppg": {"n_pi": 3, "aux_lr": 5e-4}, "data.total_frames": 128}
    assert kept == ["model.clip_eps=0.1", "data.total_frames=128"] and changed == []  # ppg: completed, the same setting
    with pytest.raises(R.ResumeRefused, match=r"^--model.clip_eps 0.2 differs from the checkpoint's 0.1: .*--resume_override model.clip_eps"):
        R.reconcile(before, saved, {"model.clip_eps"}, set(), set(R.MODEL_SAFE))
    values, _, changed = R.reconcile(before, saved, {"model.clip_eps", "data.total_frames", "model.ppg"},
                                     {"model.clip_eps"}, set(R.MODEL_SAFE))
    assert values["model.clip_eps"] == 0.2 and values["data.total_frames"] == 100_000 and "model.ppg" not in values
    assert changed == ["model.clip_eps 0.1 -> 0.2", "data.total_frames 128 -> 100000"]
    with pytest.raises(ValueError, match="--resume_override data.gamma: not given on the command line"):
        R.reconcile(before, saved, set(), {"data.gamma"}, set(R.MODEL_SAFE))
    with pytest.raises(R.ResumeRefused, match="optimizer's state"):
        R.reconcile({"model.lr": 1.0}, {"model.lr": 0.1}, {"model.lr"}, {"model.lr"}, set(R.MODEL_SAFE))


def test_the_resume_line_is_one_line():
    line = R.resume_line("last.ckpt", 128, ["data.total_frames=128"], ["model.clip_eps 0.1 -> 0.2"])
    assert "\n" not in line and line == ("resume from last.ckpt: weights, optimizer and run state (128 frames) from the checkpoint; "
                                         "settings from the checkpoint over the config: data.total_frames=128; changed on the "
                                         "command line: model.clip_eps 0.1 -> 0.2")


def test_a_dict_changed_entry_by_entry_on_resume_is_the_checkpoints_dict_shown_whole():
    # --model.objective_args.eps_high 0.4 --resume_override model.objective_args, on a checkpoint whose
    # objective_args hold eps_low 0.1: the run keeps eps_low 0.1, and the line shows the merged dict.
    saved = {"model.objective_args": {"eps_low": 0.1, "eps_high": 0.28}}
    before = {"model.objective_args": {"eps_low": 0.2, "eps_high": 0.4}}  # the config's, with the entry applied
    _, dotted = R.split_dotted(["--model.objective_args.eps_high", "0.4"])
    values, kept, changed = R.reconcile(before, saved, {"model.objective_args"}, {"model.objective_args"},
                                        set(R.MODEL_SAFE), dotted=dotted)
    assert values == {"model.objective_args": {"eps_low": 0.1, "eps_high": 0.4}} and kept == []
    assert changed == ["model.objective_args {eps_high: 0.28, eps_low: 0.1} -> {eps_high: 0.4, eps_low: 0.1}"]
    line = R.resume_line("last.ckpt", 128, kept, changed)
    assert line.endswith("changed on the command line: model.objective_args {eps_high: 0.28, eps_low: 0.1} -> "
                         "{eps_high: 0.4, eps_low: 0.1}")
    with pytest.raises(R.ResumeRefused, match=r"objective_args \{eps_high: 0.4, eps_low: 0.1\} differs"):
        R.reconcile(before, saved, {"model.objective_args"}, set(), set(R.MODEL_SAFE), dotted=dotted)
