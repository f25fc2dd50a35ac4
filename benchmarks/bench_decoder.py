"""The instrumented decoder against plain ``generate()``: speed, prefill memory, cold start.

A thin wrapper over ``python -m semviz bench --memory --cold-start`` (see
``semviz/cli/bench.py`` for what is measured); extra arguments are passed through.

    .venv/bin/python benchmarks/bench_decoder.py [--tokens 64] [--repeats 3] [--json]
"""

import sys

from semviz.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "--memory", "--cold-start", *sys.argv[1:]]))
