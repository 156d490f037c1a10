"""The commands: build what a config asks for and run it. The CLI (grpoflow/cli.py) parses and calls these.

    run.py       `grpoflow train`: run folder, model (gguf, builtin:), data, warm start, start-up checks, the RL run
    sft.py       `grpoflow sft`: the supervised warm-start stage (atomic, reused on resume)
    traps.py     start-up warnings for settings that run but cannot learn on the model given
    evaluate.py  `grpoflow eval`: validation metrics of a model folder or a run's latest checkpoint
    export.py    `grpoflow export`: a checkpoint's policy as a plain HF folder
    serve.py     `grpoflow serve tinker`: the Tinker API server (grpoflow/tinker_server) on 127.0.0.1

They sit above the controller (grpoflow/controller: the step and the run around it) and below the CLI.
"""
