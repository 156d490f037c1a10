"""Issue 53 item 7: a checkpoint written under `ulimit -f` (a real kernel EFBIG, in a child process that lowers
its own RLIMIT_FSIZE, ~4 s) is refused with an error that names the file-size limit, not the disk."""

import subprocess
import sys
from pathlib import Path


def test_a_write_past_the_file_size_limit_names_the_limit_not_the_disk(tmp_path):
    """Issue 53 item 7: under `ulimit -f` the kernel refuses a large write (EFBIG; safetensors reports it in its own
    words) and the error told the user to free disk space. It names the limit and `ulimit -f` instead. In a child
    process, which sets the limit (4 KiB) and ignores SIGXFSZ as grpoflow train does under a limit."""
    child = f"""
import resource, signal
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
import torch
from safetensors.torch import save_file
from grpoflow.controller.checkpoint import CheckpointManager, CheckpointWriteError
def write(folder):
    folder.mkdir(parents=True)
    save_file({{"w": torch.zeros(25_000)}}, str(folder / "model.safetensors"))
try:
    CheckpointManager({str(tmp_path)!r}).save(1, write)
except CheckpointWriteError as e:
    print(e)
"""
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).parents[2])
    message = out.stdout.strip()
    assert message.startswith("could not write the checkpoint"), (out.stdout, out.stderr[-2000:])
    assert "may write no file over 4096 bytes" in message and "ulimit -f unlimited" in message, message
    assert "free space" not in message

