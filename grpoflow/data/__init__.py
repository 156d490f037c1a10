"""Data: prompt datasets in verl's and TRL's conventions, the typed `Batch`, samplers, tool-call formats.

    batch.py               the typed Batch moved between controller and workers (select/split/concat)
    dataset.py             jsonl/json/parquet/arrow/HF-folder rows, TRL and verl conventions, chat templates
    tool_format.py         the tool-call format, one registry entry each (parse, render, strip): Hermes <tool_call>
                           JSON built in, others by name or path/to/file.py:function (rollout.multi_turn.tool_parser)
    prepare.py             grpoflow data: gsm8k, math, countdown -> verl-style parquet
    sampler.py             seeded, per-epoch shuffling sampler with a saveable position; the PromptSampler protocol
    curriculum.py          curriculum sampler: easy / learnable / hard pools by recent pass rate, retirement, saveable
"""
