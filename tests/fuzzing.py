"""How many examples the property tests run: the suite's default, or `make fuzz`'s many more."""

from __future__ import annotations

import os


def examples(default: int) -> int:
    return max(1, int(default * float(os.environ.get("MUSTER_FUZZ_SCALE", "1"))))
