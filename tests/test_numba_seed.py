"""Kernels shipped compiled (keygroups._numba_seed, built by keyfill.numba_warm): a fresh
process with an empty numba cache, importing keyfill from another folder than the one the
seed was built in, loads every kernel and compiles none; a seed that does not fit is ignored."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numba
import pytest

from keygroups import _numba_seed

CHECK = """
import json, os, sys, tempfile
from pathlib import Path
import keygroups._numba as kn
import numba
from keyfill.numba_warm import kernels, exercise_tasks
with tempfile.TemporaryDirectory() as work:
    replayed = exercise_tasks(Path(work))
print(json.dumps({"seeded": kn._generic, "cpu": numba.config.CPU_NAME, "replayed": replayed,
                  "file": kn.__file__, "kernels": kernels()}))
"""


def _run(code: Path, script: str, cache: Path, **env: str) -> dict:
    full = {**os.environ, "PYTHONPATH": str(code), "NUMBA_CACHE_DIR": str(cache), **env}
    for name in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", "KEYFILL_NUMBA_SEED"):
        if name not in env:
            full.pop(name, None)
    proc = subprocess.run([sys.executable, "-c", script], env=full, cwd=code, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def seeded(seeded_packages, tmp_path_factory) -> tuple[Path, dict]:
    """Packages with a seed, built in one folder and then copied (new mtimes) to another, as
    a wheel built on one machine is installed on another."""
    built, manifest = seeded_packages
    installed = tmp_path_factory.mktemp("seed") / "installed"
    shutil.copytree(built, installed)
    return installed, manifest


def test_the_seed_holds_the_tasks_kernels(seeded):
    code, manifest = seeded
    assert manifest["numba"] == numba.__version__ and manifest["cpu"] == "generic"
    assert manifest["not_compiled"] == [] and len(manifest["kernels"]) > 40
    for rel, names in manifest["dirs"].items():
        assert (code / rel).is_dir(), rel
        assert any(n.endswith(".nbi") for n in names) and any(n.endswith(".nbc") for n in names)
        for name in names:
            assert (code / "keygroups" / "_numba_cache" / rel / name).is_file()


def test_a_fresh_process_loads_the_seed_and_compiles_nothing(seeded, tmp_path):
    code, manifest = seeded
    out = _run(code, CHECK, tmp_path / "empty-cache")
    assert out["file"].startswith(str(code))
    assert out["seeded"] and out["cpu"] == "generic"
    assert out["replayed"] == 20_000
    compiled = sorted(k for k, v in out["kernels"].items() if v["compiled"])
    assert compiled == [], f"compiled despite the seed: {compiled}"
    # kernels called from Python load from the cache; those only called by other kernels
    # come inside their callers' code and show no cache hit of their own
    loaded = {k for k, v in out["kernels"].items() if v["loaded"]}
    assert len(loaded) >= 15 and loaded <= set(manifest["kernels"])


def test_a_seed_for_another_numba_is_ignored(seeded, tmp_path):
    code, _ = seeded
    other = tmp_path / "other"
    shutil.copytree(code, other)
    path = other / "keygroups" / "_numba_cache" / "seed.json"
    manifest = json.loads(path.read_text())
    path.write_text(json.dumps({**manifest, "numba": "0.1.0"}))
    script = (
        "import json, os, keygroups._numba as kn; print(json.dumps([kn._generic, os.environ.get('NUMBA_CPU_NAME')]))"
    )
    assert _run(other, script, tmp_path / "c1") == [False, None]
    assert not any((tmp_path / "c1").rglob("*.nbi")), "files of an unusable seed were installed"
    # the user's own CPU choice, or KEYFILL_NUMBA_SEED=0, wins over a seed that fits
    assert _run(code, script, tmp_path / "c2", NUMBA_CPU_NAME="host") == [False, "host"]
    assert _run(code, script, tmp_path / "c3", KEYFILL_NUMBA_SEED="0") == [False, None]
    assert _run(code, script, tmp_path / "c4") == [True, "generic"]


def test_workers_seeding_one_cache_at_once_leave_whole_files(seeded, tmp_path):
    code, manifest = seeded
    cache = tmp_path / "shared"
    script = "import keygroups._numba as kn; print(kn._generic)"
    env = {**os.environ, "PYTHONPATH": str(code), "NUMBA_CACHE_DIR": str(cache)}
    env.pop("NUMBA_CPU_NAME", None)
    procs = [
        subprocess.Popen([sys.executable, "-c", script], env=env, cwd=code, stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    assert [p.communicate()[0].strip() for p in procs] == ["True"] * 4
    seed = code / "keygroups" / "_numba_cache"
    for rel, names in manifest["dirs"].items():
        (folder,) = [d for d in cache.iterdir() if any((d / n).exists() for n in names)]
        for name in names:
            assert (folder / name).read_bytes() == (seed / rel / name).read_bytes()
        assert not list(folder.glob(".*.tmp"))
        assert (folder / f"keyfill-seed-{manifest['digest']}").exists()


def test_usable_seed_checks_every_field(tmp_path, monkeypatch):
    monkeypatch.setattr(_numba_seed, "SEED_DIR", tmp_path)
    for name in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", "KEYFILL_NUMBA_SEED"):
        monkeypatch.delenv(name, raising=False)
    assert _numba_seed.usable_seed() is None  # no seed shipped
    good = {**_numba_seed.target(), "digest": "x", "dirs": {}}
    for field, wrong in [("numba", "0.1.0"), ("python", "py27"), ("machine", "s390x"), ("cpu", "skylake")]:
        (tmp_path / "seed.json").write_text(json.dumps({**good, field: wrong}))
        assert _numba_seed.usable_seed() is None, field
    (tmp_path / "seed.json").write_text("{not json")
    assert _numba_seed.usable_seed() is None
    (tmp_path / "seed.json").write_text(json.dumps(good))
    assert _numba_seed.usable_seed() == good
    monkeypatch.setenv("NUMBA_CPU_FEATURES", "")
    assert _numba_seed.usable_seed() is None
