"""Tasks: the built-in tasks' rows, and reasoning-gym and verifiers tasks as rows.

    tasks/addition.py      the built-in task
    tasks/chat_addition.py the same task as chat messages, for pretrained chat models (builtin:chat_addition/...)
    tasks/multi_turn.py    guess_number and calculator rows with demonstration conversations (builtin:guess_number/...)
    tasks/reasoning_gym_tasks.py  data.train_files=reasoning_gym:TASK?size=..&seed=..&option=..: a reasoning-gym task's
                           rows (docs/environments.md)
    tasks/verifiers_tasks.py  data.train_files=verifiers:TASKSET?limit=..&option=..: a verifiers taskset's tasks as rows
"""
