"""`python3 -m mutwo`: commands of the Python package that need no server.

    python3 -m mutwo verify MODEL_PY:FACTORY --schedule s.json --batch N \
        --device cuda:0|cpu [--inputs SPEC ...] [--loss ...] \
        [--optimizer sgd|adam] [--steps K] [--output text|json]

`verify` measures a schedule on the eager model in the user's own process
(mutwo.apply beside the unmodified step; client/python/mutwo/_verify.py,
docs/apply.md). Exit codes as `mutwo-worker execute`: 0 holds, 1 does not
hold, 2 bad arguments or input, 3 infeasible schedule (not run).
"""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # argparse exits 2 as well; the message names the command.
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: {message}\n")


def main(argv: Optional[List[str]] = None) -> int:
    from mutwo import _verify
    parser = _Parser(prog="python3 -m mutwo",
                     description="mutwo's Python commands")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    verify = commands.add_parser(
        "verify", help="measure a schedule on your eager model",
        description=_verify.__doc__.split("\n\n", 2)[2].split("\nExit")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit codes: 0 the schedule holds (within budget, gradients "
        "equal); 1 it does not; 2 bad arguments or input; 3 infeasible "
        "schedule, nothing run (--force runs it)")
    verify.__class__ = _Parser
    _verify.add_arguments(verify)
    args = parser.parse_args(argv)
    if args.command == "verify":
        return _verify.verify(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
