"""`python -m bench.log_usage`: what a finished job's copy costs to hold to its project's log quota.

A project's log directory holds one copy per job it ran within LOG_RETENTION_DAYS (and its
stamps, `.times`); the quota's budget reads the bytes of every other copy once per finished job
that printed anything (runs/log_storage.py `_usage`). Prints, per number of copies in the
directory, the milliseconds of one read (median of --reps), on this machine's page cache.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.log_usage")
    p.add_argument("--copies", default="1000,10000,50000", help="copies in the project's directory, comma-separated")
    p.add_argument("--reps", type=int, default=7)
    args = p.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "muster.settings")
    with tempfile.TemporaryDirectory() as root:
        os.environ["MUSTER_DATA_DIR"] = root  # no database is used; its settings need a place
        import django

        django.setup()
        from runs import log_storage

        where = log_storage.project_dir(1)
        where.mkdir(parents=True)
        made = 0
        print("copies  ms per read  us per copy")
        for n in sorted(int(c) for c in args.copies.split(",")):
            for i in range(made, n):
                (where / f"{i:08d}-0000-0000-0000-000000000000.log").write_bytes(b"x" * 100)
                (where / f"{i:08d}-0000-0000-0000-000000000000.times").write_bytes(b"t" * 16)  # not counted
            made = n
            own = Path(where / "own.log")
            times = []
            for _ in range(args.reps):
                t = time.perf_counter()
                total = log_storage._usage(1, own)
                times.append(time.perf_counter() - t)
            assert total == 100 * n, total
            ms = statistics.median(times) * 1000
            print(f"{n:6d}  {ms:11.2f}  {ms * 1000 / n:11.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
