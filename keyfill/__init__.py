"""keyfill's command line (`keyfill`, `python -m keyfill`), its synthetic archives
(`keyfill.synth`) and the kit that tests a user's own job against a backfill
(`keyfill.testing`). The work itself lives in `compactor`, `reader` and `keygroups`."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("keyfill")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "unknown"

__all__ = ["__version__"]
