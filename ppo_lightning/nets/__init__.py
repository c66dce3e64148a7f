"""Networks: the actor-critic registry and distributions (`models`), the IMPALA CNN (`impala`) and its
phasic (PPG) layouts (`impala_phasic`), the MinAtar CNN (`minatar_cnn`), observation normalization
(`obs_norm`), S networks stacked for vectorized seeds (`seed_stack`; the MinAtar CNN's batched form:
`minatar_stacked`).

May import: `core`.
"""
