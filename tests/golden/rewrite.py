"""Rewrite tests/golden/tiny_run.json from a fresh golden run, saying why: a change that moves the numbers on
purpose (a new default, a fixed bug, another kernel) is recorded here, with the commit it was written at.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python -m tests.golden.rewrite --why "cosine schedule is the default now"
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import tempfile
from pathlib import Path

from tests.golden.run import GOLDEN, OVERRIDES, differences, machine, run_golden


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--why", required=True, help="what changed the numbers, in one sentence")
    args = parser.parse_args(argv)
    if len(args.why.strip()) < 10:
        parser.error("--why needs a sentence saying what moved the numbers (10 characters or more).")
    with tempfile.TemporaryDirectory() as tmp:
        steps = run_golden(Path(tmp) / "run")
    old = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {"history": [], "steps": []}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=GOLDEN.parent).stdout.strip() or "unknown"
    changed = differences(old["steps"], steps, exact=True) if old["steps"] else ["first written"]
    entry = {"date": datetime.date.today().isoformat(), "commit": commit, "why": args.why.strip(),
             "changed": len(changed)}
    record = {"machine": machine(), "overrides": OVERRIDES, "steps": steps, "history": [*old["history"], entry]}
    GOLDEN.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {GOLDEN} ({len(changed)} numbers changed) on {record['machine']}")
    for line in changed[:20]:
        print("  " + line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
