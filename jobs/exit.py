"""How a spark-submit entry point ends: keyfill's errors as one line, as the CLI prints them."""

from __future__ import annotations

import sys
from collections.abc import Callable


def one_line_errors(main: Callable[[], int], prog: str) -> int:
    """main(), with a KeyfillError as one line on stderr and exit status 2 (as `keyfill`),
    and so too whatever a Spark Connect session stopped for want of an answer raised."""
    from keygroups import connect_watch
    from keygroups.errors import KeyfillError

    try:
        return main()
    except Exception as exc:
        found = connect_watch.lost() or (exc if isinstance(exc, KeyfillError) else None)
        if found is None:
            raise
        print(f"{prog}: error: {found}", file=sys.stderr)
        return 2
