"""Training: one model and its optimizer on one rank or sharded with FSDP2 over many.

`engine` (`TrainEngine`: forward_backward / optimizer_step / named_weights / save / load),
`microbatch` (token-budget micro-batches, equal counts across ranks), `collectives` (the rank's
device and the few all-reduces the workers need), `forward` (the no-grad log-prob pass).
Nothing here imports `grpoflow.engines`: the two meet only in the workers.

    engine.py              TrainEngine: forward_backward, optimizer_step (clip, NaN check), LR schedule,
                           set_hyperparameters (AdamW's settings per step: serve tinker); FSDP2 when there are several
                           ranks (summed gradients, full-state save/load, full weights for sync)
    precision.py           each role's weights/compute dtype and how (copy, FSDP policy, autocast), decided once
    mixed_precision.py     the bf16 compute copy of the actor with float32 master weights (gradient hooks, refresh)
    budget.py              the micro-batch token budget chosen from memory (actor.max_tokens_per_microbatch=0)
    bf16_units.py          bf16 units of the CPU (/proc/cpuinfo) and GPU (capability >= 8.0):
                           model.compute_dtype's default and auto, the slow-bf16 warning
    microbatch.py          token-budget micro-batches, length-sorted, padding trimmed, equal counts across ranks
    forward.py             micro-batched passes: the no-grad per-token forward (log-probs, values) and the update
                           loop (mini-batches x epochs x micro-batches) shared by actor and critic
    collectives.py         rank, world size, device of this process; global sums/max over ranks
    timing.py              StageTimer: timing_s/<stage> (the step's stages; the actor's train_forward,
                           forward_backward, optimizer)
"""
