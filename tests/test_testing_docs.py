"""The example of docs/testing.md runs as written."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "testing.md"


def test_the_fraud_windows_example_of_the_docs_passes(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) == 1
    path = tmp_path / "docs_testing_example.py"  # a real file: hypothesis reads the test's source
    path.write_text(blocks[0])
    spec = importlib.util.spec_from_file_location("docs_testing_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.test_fraud_windows_backfill_as_they_run_live()
