"""Networks: the actor-critic registry and distributions (`models`), the image CNNs and the rule that
picks one (`pixel_cnn`), the IMPALA CNN (`impala`) and its phasic (PPG) layouts (`impala_phasic`), the
MinAtar CNN (`minatar_cnn`), LSTM and GRU cores after any of their encoders (`recurrent`), observation
normalization (`obs_norm`), S networks stacked for vectorized seeds (`seed_stack`; the batched forms of
the MinAtar CNN, `minatar_stacked`, and of the MLP actor-critic, `mlp_stacked`); any gymnasium space:
the per-part observation encoders (`encoders`), the composite action distribution (`composite`) and the
MLP actor-critic that reads them (`spaces_net`).

May import: `adapters`, `core`.
"""
