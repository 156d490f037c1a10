"""`grpoflow serve tinker` as a child process for the SDK tests: started on a free port, waited for, killed."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
API_KEY = "tml-grpoflow-test"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, root: Path, *overrides: str, log: Path | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log or root.with_name(root.name + f"-server-{self.port}.log")
        env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                   HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        args = [sys.executable, "-m", "grpoflow.cli", "serve", "tinker", f"tinker.port={self.port}",
                f"tinker.root={root}", f"tinker.api_key={API_KEY}", *overrides]
        self._out = open(self.log, "w")
        self.proc = subprocess.Popen(args, stdout=self._out, stderr=subprocess.STDOUT, env=env)
        self._wait_ready(120)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited ({self.proc.returncode}):\n{self.log.read_text()}")
            try:
                with urllib.request.urlopen(f"{self.url}/api/v1/healthz", timeout=2):
                    return
            except OSError:
                time.sleep(0.3)
        self.kill()
        raise RuntimeError(f"the server did not answer within {timeout} s:\n{self.log.read_text()}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(30)
        self._out.close()
