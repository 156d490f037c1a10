"""Training: one model and its optimizer on one rank or sharded with FSDP2 over many.

`engine` (`TrainEngine`: forward_backward / optimizer_step / named_weights / save / load),
`microbatch` (token-budget micro-batches, equal counts across ranks), `collectives` (the rank's
device and the few all-reduces the workers need), `forward` (the no-grad log-prob pass).
Nothing here imports `grpoflow.engines`: the two meet only in the workers.
"""
