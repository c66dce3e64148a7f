"""Studies: arms x environments x seeds as a file (`spec`), run on any number of workers through
submitit (`runner`), recorded per cell (`records`), analysed with rliable (`analysis`) and reported
in the reader's terms (`report`); ``ppo-lightning study run|status|report FILE`` (`command`).

May import: every layer below `cli` (`run` for the groups' runs, algos for the members' settings);
`tuning` (records, analysis) and the command dispatcher (`ppo_lightning.cli.main`) import it.
"""
