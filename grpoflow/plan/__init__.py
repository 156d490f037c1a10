"""One place assembles a run: the start-up check (checks.py: every registry name the config holds resolved once, into
`RunParts`) and the plan (run_plan.py: rows, model folder, tokenizer, prompts, compute dtype, resolved once into
`RunPlan`). `grpoflow train`, `sft` and `eval` build it the same way; the controller takes it and resolves nothing.

It sits below the workers (they take `RunParts`) and above trajectories, engines and models (docs/architecture.md).
"""
