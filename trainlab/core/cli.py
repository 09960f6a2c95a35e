"""Entry-point wrapper: a user error prints one clear message and exits with its own code; --debug adds a traceback."""

from __future__ import annotations

import argparse
import atexit
import os
import sys
import threading
import traceback
from collections.abc import Callable

from trainlab.core.errors import UserError

DEBUG_ENV = "TRAINLAB_DEBUG"


def command_parser(prog: str, description: str | None = None, **kwargs) -> argparse.ArgumentParser:
    """An ArgumentParser whose --help also shows --debug (run_cli reads and removes it before parsing)."""
    parser = argparse.ArgumentParser(prog=prog, description=description, **kwargs)
    parser.add_argument("--debug", action="store_true",
                        help=f"also print the full traceback of an error; the exit code stays the error's own "
                             f"(or set {DEBUG_ENV}=1)")
    return parser


def debug_enabled(argv: list[str] | None = None) -> bool:
    argv = sys.argv if argv is None else argv
    return "--debug" in argv or os.environ.get(DEBUG_ENV, "") not in ("", "0", "false")


def run_cli(main: Callable[[list[str]], object], argv: list[str] | None = None, teardown: bool = True) -> None:
    """Call `main(argv)`; turn a UserError into `error: ...` on stderr and its exit code (with --debug, after its
    traceback: a script that checks the code sees the same code either way). `teardown=False` (the DVC stages):
    after a success, exit as soon as the threads and atexit work are done (exit_without_teardown)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = debug_enabled(argv)
    argv = [a for a in argv if a != "--debug"]
    try:
        main(argv)
    except UserError as exc:
        if debug:
            traceback.print_exception(exc, file=sys.stderr)
        print(f"error: {exc}", file=sys.stderr)
        if not debug:
            print(f"(set {DEBUG_ENV}=1 or pass --debug for a traceback)", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    if not teardown:
        exit_without_teardown()


def exit_without_teardown() -> None:
    """Exit 0 the way the interpreter does (wait for the non-daemon threads, run the atexit work, flush), but skip
    its teardown: freeing every object of torch and MLflow took 2-3 s after a training stage had written everything
    (2-core AMD EPYC Zen 4), and DVC waits for the process to end."""
    threading._shutdown()  # what the interpreter calls first at exit: joins non-daemon threads, thread pools' hooks
    atexit._run_exitfuncs()  # logging.shutdown among them
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
