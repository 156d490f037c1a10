"""Workers: the roles, plain classes with small verbs (docs/architecture.md, "Contracts").

    actor.py               log-probs, policy update (mini-batches x micro-batches), weights for sync
    frozen.py              the frozen model role, computing as the actor does: the reference's log-probs (built only
                           for a KL term) and distillation's teacher (log-probs and top-k of the student's tokens)
    critic.py              value model (LM + scalar head): values, clipped value-loss update
    reward_model.py        a sequence-classification reward model scoring prompt + completion
    judge.py               a local LLM judge: one batched greedy generate over the step's judge prompts
    rollout.py             a share of the step's prompts -> Batch of their trajectories; receives weights
    rollout_kinds.py       the kind of rollout the config asks for: single-turn, EnvLoop, agent episodes
"""
