"""The classifier comparison of the benchmark suite (engine vs plain loop vs Lightning), under its former name.

    python -m benchmarks.engine_vs_plain [--quick] [--repeats 3]   # same as: python -m benchmarks --only classifier
"""

from __future__ import annotations

import sys

from benchmarks.__main__ import main

if __name__ == "__main__":
    sys.exit(main(["--only", "classifier", *sys.argv[1:]]))
