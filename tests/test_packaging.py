"""keyfill shipped as a zip (`spark-submit --py-files keyfill-*.whl` puts the wheel on the
executors' sys.path as a zip): its compiled kernels import and run, compiling in the process
instead of caching (numba cannot cache functions whose source is not a file)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

PROBE = """
import sys
sys.path.insert(0, sys.argv[1])
import keygroups._numba as nb
import keygroups.envelope.snappy as snappy
import cramjam
assert nb.FROM_ZIP and '.zip' in snappy.__file__, snappy.__file__
import numpy as np
data = bytes(range(256)) * 64
src = np.frombuffer(bytes(cramjam.snappy.compress_raw(data)), np.uint8)
starts, ends = np.array([0]), np.array([len(src)])
(n,) = snappy.snappy_lengths(src, starts, ends)
out = np.zeros(n + snappy.SLACK, np.uint8)
assert snappy.decompress_blocks(src, starts, ends, out, np.array([0]), np.array([n])) == -1
print(out[:n].tobytes() == data)
"""


def test_the_kernels_run_from_a_zip(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    archive = tmp_path / "keyfill.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for folder, _, files in os.walk(os.path.join(root, "keygroups")):
            for f in files:
                if f.endswith(".py"):
                    path = os.path.join(folder, f)
                    z.write(path, os.path.relpath(path, root))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NUMBA_CACHE_DIR")}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(archive)], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600
    )
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr[-2000:]
