"""`crl-jax sweep` as a script (kept for existing commands): the same arguments, errors as `sweep: error: ...`.

    python experiments/sweep.py --config experiments/configs/sweep_example.yaml --out runs/sweep [...]

See `crl_jax/infra/sweep_cmd.py` (the command) and `crl_jax/infra/sweep.py` (the file format, engines, resume).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from crl_jax.infra import sweep_cmd
from crl_jax.infra.cli_errors import report_errors


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="crl-jax sweep: " + sweep_cmd.__doc__.split("\n")[0])
    sweep_cmd.add_arguments(ap)
    return report_errors(sweep_cmd.main, ap.parse_args(argv), prog="sweep")  # bad input: one line, exit 2


if __name__ == "__main__":
    sys.exit(main())
