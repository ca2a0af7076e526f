"""How every taskdata command ends: one line for a user's error, a distinct exit code for each outcome.

``run_command`` runs a command's body and turns what it raises into an exit code and at most a
few lines on stderr: the expected failures (a bad flag value, an unknown name, a missing file, a
cache job that failed on its data) print ``PROG: error: MESSAGE`` and no traceback; a traceback is
printed only for ``--debug`` or for an exception nobody expected (a bug). The codes, also listed in
the README:

====  =====================================================================
0     success
1     the command ran and found a problem (``verify`` failed, ``eval`` could not score)
2     usage or input error (a flag, name, value or file that is wrong)
3     the work failed on its data or a service (the cache job's pipeline, the assignment server)
70    an internal error (a bug: the traceback is printed)
130   interrupted (Ctrl-C)
141   stdout was closed early (``... | head``)
====  =====================================================================
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable

__all__ = [
    "EXIT_BROKEN_PIPE",
    "EXIT_DATA",
    "EXIT_FAILED",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "run_command",
]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_DATA = 3
EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141

ErrorKinds = tuple[type[BaseException], ...]


def run_command(
    prog: str,
    body: Callable[[], int | None],
    *,
    usage_errors: ErrorKinds,
    data_errors: ErrorKinds = (),
    debug: bool = False,
) -> int:
    """Runs ``body`` and returns its exit code; see the module docstring for what each failure gives."""
    try:
        code = int(body() or 0)
        sys.stdout.flush()  # a closed pipe shows up here for output still buffered
        return code
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader (e.g. `head`) has all it wants. Point stdout at /dev/null so that the interpreter's
        # own flush at exit does not raise again (the recipe in Python's signal documentation).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except SystemExit:
        raise
    except data_errors + usage_errors as e:
        if debug:
            traceback.print_exc()
        print(f"{prog}: error: {error_text(e)}", file=sys.stderr)
        return EXIT_DATA if isinstance(e, data_errors) and not isinstance(e, usage_errors) else EXIT_USAGE
    except Exception:
        traceback.print_exc()
        print(f"{prog}: internal error (a bug; the traceback above says where). Please report it.", file=sys.stderr)
        return EXIT_INTERNAL


def error_text(error: BaseException) -> str:
    """The message of an expected error, without the quoting ``KeyError`` adds or an empty message."""
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        return f"{error.strerror}: {error.filename}"
    text = str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)
    return text or type(error).__name__
