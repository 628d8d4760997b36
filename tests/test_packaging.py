"""keyfill shipped as a zip (`spark-submit --py-files keyfill-*.whl` puts the wheel on the
executors' sys.path as a zip): its packages load from a copy extracted once per machine
(keygroups._from_zip), so the compiled kernels run, and the next process loads them from
numba's cache instead of compiling again (numba cannot cache a source that is not a file)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

PROBE = """
import sys
sys.path.insert(0, sys.argv[1])
import keygroups
import keygroups._numba as nb
import keygroups.envelope.snappy as snappy
import cramjam
assert '.zip' in keygroups.__file__ and not nb.FROM_ZIP, keygroups.__file__
assert snappy.__file__.startswith(sys.argv[2]), snappy.__file__
import numpy as np
data = bytes(range(256)) * 64
src = np.frombuffer(bytes(cramjam.snappy.compress_raw(data)), np.uint8)
starts, ends = np.array([0]), np.array([len(src)])
(n,) = snappy.snappy_lengths(src, starts, ends)
out = np.zeros(n + snappy.SLACK, np.uint8)
assert snappy.decompress_blocks(src, starts, ends, out, np.array([0]), np.array([n])) == -1
print(out[:n].tobytes() == data, sum(snappy.decompress_blocks.stats.cache_hits.values()))
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
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    hits = []
    for _ in range(2):  # the first process compiles, the second loads the first's cache
        done = subprocess.run(
            [sys.executable, "-c", PROBE, str(archive), str(tmp_path / "cache" / "keyfill" / "code")],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
            timeout=600,
        )
        assert done.returncode == 0 and done.stdout.split()[0] == "True", done.stderr[-2000:]
        hits.append(int(done.stdout.split()[1]))
    assert hits[0] == 0 and hits[1] > 0
