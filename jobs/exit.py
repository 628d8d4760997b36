"""How a spark-submit entry point ends: keyfill's errors as one line, as the CLI prints them."""

from __future__ import annotations

import sys
from collections.abc import Callable


def one_line_errors(main: Callable[[], int], prog: str) -> int:
    """main(), with a KeyfillError as one line on stderr and exit status 2 (as `keyfill`)."""
    from keygroups.errors import KeyfillError

    try:
        return main()
    except KeyfillError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
