"""The Python process Spark starts to plan one streaming query over a Python source
(`python -m pyspark.sql.streaming.python_streaming_source_runner`): a process of its own
per query and source, whose start is part of every query's time.

pyarrow imports pandas the first time almost anything converts (`pa.array`, `pa.scalar`,
`to_numpy`, compute with a Python number): 0.25 s of CPU, most of what keyfill's planning
cost at a query's start (0.28 s with it, 0.03 s without, over a 2M-record archive), for a
library the planner never uses. Nothing in pyarrow says "no pandas" short of pandas
failing to import, so in that process alone keyfill makes it fail to import: pyarrow then
takes every object for a non-pandas one, and a call that needs pandas itself (`to_pandas`)
still tries the import again and says pandas is missing. Only Spark's planning runner is
touched, never a task's worker or a user's own process, where other code may use pandas.
"""

from __future__ import annotations

import importlib.abc
import sys

RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"


def in_planning_process() -> bool:
    """Whether this is the process Spark started to plan a streaming query (`python -m` of
    its runner module)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) == RUNNER


class _NoPandas(importlib.abc.MetaPathFinder):
    """Fails every import of pandas (a finder, not a None in sys.modules: Cython's import,
    pyarrow's, takes a None found there for the module)."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError(f"{name}: kept out of Spark's planning process by keyfill", name=name)
        return None


def keep_pandas_out() -> bool:
    """In the planning process, before the planner first touches pyarrow: make `import
    pandas` fail there, unless something already imported it. Returns whether it did."""
    if "pandas" in sys.modules or not in_planning_process():
        return False
    if not any(isinstance(f, _NoPandas) for f in sys.meta_path):
        sys.meta_path.insert(0, _NoPandas())
    return True
