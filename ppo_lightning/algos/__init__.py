"""The equations and what composes them: one pure tensor function per formula (`objectives`), the
objectives by name (`registry`), the PPO-family loss module (`loss`), the EWMA proximal policy
(`proximal`), PPG's phases (`ppg`), GAE and the normalizers (`advantages`), the batch-size-invariance
rules (`scaling`), staleness (`staleness`), learning-rate schedules (`schedules`).

May import: `adapters`, `core`, `nets`.
"""
