"""Controller: the RL step, and the run around it (docs/architecture.md, "One step's dataflow").

    trainer.py             Controller: the roles, step() (each stage adds its field to the batch), advantages,
                           checkpoint save/load
    fit.py                 RunLoop: the run around the step: resume, the steps with validation and checkpoints,
                           metrics to the console, metrics.jsonl and trackers, preemption, automatic restarts
    partial.py             PartialQueue (rollout.partial), the pool policy: groups carried from step to step (played
                           through Rollouts.submit), due groups, the step's complete groups in completion order,
                           staleness metrics, the pool in checkpoints
    rollouts.py            Rollouts: one path for every kind of run (submit -> Pending -> Batch, rows attached by
                           group id, the rollout's metrics), RolloutQueue (async look-ahead)
    rewarding.py           RewardAssembly: rule rewards + judge + reward model + overlong penalty, greedy baselines;
                           the roles and assembly from the config, for the run and grpoflow eval alike
    reward_health.py       a step on which every reward call failed (or too many over 5 steps) stops the run;
                           the no-signal warning
    judging.py             the judge stage: which samples are judged (by data_source), their scores into the rows
    distill.py             the teacher: path, tokenizer check, privileged prompts, its scores and the mixed advantage
    curriculum.py          which prompt sampler a run uses; pass rates back to it; zero-advantage group share
    weight_sync.py         actor -> engines: a stream when colocated, buckets through the controller when split
    step_math.py           the controller's own arithmetic as pure functions (token rewards, masks, group filter)
    checks.py              the one start-up check: every registry-backed key resolved before any model loads
    placement.py           where the roles run: one local rank, Ray colocated, or Ray split (the pools a config
                           asks for)
    checkpoint.py          step checkpoints (published by atomic_folder.py), `latest` pointer, keep_last; failed
                           writes, damaged checkpoints (or a garbage `latest`) skipped for the one before
    run_folder.py          one run per folder: flock lock, a fresh start moves an earlier run aside, a resume with
                           changed training settings refused (trainer.resume_config_changes=allow)
    preemption.py          SIGTERM / Ctrl-C: finish the step, checkpoint, exit 0 (second Ctrl-C: stop at once)
    restart.py             trainer.max_restarts: which worker faults a rebuild cures, restarts.jsonl, the advice
    held_out.py, val_metrics.py   validation on the held-out prompts, k samples each: mean@k, std@k, pass@k, maj@k;
                           samples.jsonl
    train_samples.py       a few training groups per step to train_samples.jsonl, from a writer thread (`grpoflow view`)
    trackers.py            TensorBoard, W&B (offline), MLflow
    metrics.py             console + metrics.jsonl logger (reading it back: metrics_file.py)
"""
