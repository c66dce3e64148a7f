"""Tuning: Optuna searches whose trials train as members of one vectorized group.

A search space is a file (`space`); ``ppo-lightning tune`` (`command`) asks Optuna for trials, packs
them into groups whose members carry their own settings (``data.member_hparams``), trains the
groups (`runner`: several workers share a study through Optuna's journal file; `reporter`: the
Lightning callback through which a group reports each trial's curve) and ends with the
best settings, their interval over seeds, plots of the search and the command that trains them
(`summary`).

May import: every layer below `cli` (`run` for the groups, studies' records and analysis); only the
command dispatcher (`ppo_lightning.cli.main`) imports it.
"""
