"""One vocabulary of reading options (docs/options.md): a setting the replay and the Spark
source share has one name, spelt snake_case in the API, --kebab-case on the command line
and camelCase in Spark; the names come from the dataclass fields."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import pytest

from keyfill.cli import replay as replay_cli
from keygroups.errors import OptionError
from reader.errors import DataSourceOptionError
from reader.options import ReplayOptions
from reader.spark.options import KAFKA_OPTION_NAMES, OPTION_NAMES, Options, camel

DOC = (Path(__file__).resolve().parents[1] / "docs" / "options.md").read_text()
NOT_SETTINGS = {"url", "checkpoint_file", "no_progress", "json", "help"}  # what the command does, not how it reads


def replay_flags() -> dict[str, argparse.Action]:
    parser = argparse.ArgumentParser()
    replay_cli.add(parser.add_subparsers())
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["replay"]
    return {a.dest: a for a in sub._actions if a.dest not in NOT_SETTINGS}


def test_every_replay_flag_is_a_replay_option_with_its_default() -> None:
    fields = {f.name: f.default for f in dataclasses.fields(ReplayOptions)}
    flags = replay_flags()
    assert flags, "no flags found: the check would pass on nothing"
    for dest, action in flags.items():
        assert dest in fields, f"--{dest.replace('_', '-')} is not a ReplayOptions field"
        assert action.option_strings == [f"--{dest.replace('_', '-')}"]
        assert action.default == fields[dest], f"--{action.option_strings[0]} default differs from ReplayOptions"


def test_spark_options_are_the_camel_case_of_the_source_fields() -> None:
    fields = [f.name for f in dataclasses.fields(Options) if f.name not in ("kafka", "session_cores", "columns")]
    assert list(OPTION_NAMES) == [camel(f) for f in fields]
    assert camel("max_slices_per_trigger") == "maxSlicesPerTrigger"
    shared = {f for f in fields} & {f.name for f in dataclasses.fields(ReplayOptions)}
    assert {"batch_size", "read_ahead_bytes", "range_bytes"} <= shared
    for name in ("batch_size", "range_bytes"):  # the same setting, the same default
        assert getattr(Options, name) == getattr(ReplayOptions, name)


def test_the_table_names_every_option() -> None:
    table = {m for m in re.findall(r"`([^`]+)`", DOC)}
    missing = [n for n in OPTION_NAMES if n != "path" and n not in table]
    missing += [n for n in KAFKA_OPTION_NAMES if n not in table]
    missing += [a.option_strings[0] for a in replay_flags().values() if a.option_strings[0] not in table]
    missing += [f.name for f in dataclasses.fields(ReplayOptions) if f.name not in table]
    assert not missing, f"docs/options.md does not name {missing}"


def test_a_shared_setting_parses_to_the_field_of_its_name() -> None:
    opts = Options.parse({"path": "/a", "batchsize": "7", "readAheadBytes": "0", "RANGEBYTES": "4096"})
    assert (opts.batch_size, opts.read_ahead_bytes, opts.range_bytes) == (7, 0, 4096)
    assert Options.parse({"path": "/a"}).read_ahead_bytes == Options.read_ahead_bytes


def test_every_surface_holds_an_option_to_the_limits_its_field_declares() -> None:
    """Limits are declared once, on the field: the Spark parser and the replay's options both
    refuse one past them, naming the option, and a setting the two share has the same limits."""
    bounded = [f for f in dataclasses.fields(Options) if "bounds" in f.metadata]
    assert len(bounded) >= 9, "no bounded fields found: the check would pass on nothing"
    for f in bounded:
        low, high, _ = f.metadata["bounds"]
        name = camel(f.name)
        assert getattr(Options.parse({"path": "/a", name: str(low)}), f.name) == low
        assert getattr(Options.parse({"path": "/a", name: str(high)}), f.name) == high
        for bad in (low - 1, high + 1):
            refused = f"option {name}={str(bad)!r}: must be between {low:,} and {high:,}"
            with pytest.raises(DataSourceOptionError, match=re.escape(refused)):
                Options.parse({"path": "/a", name: str(bad)})
    replay = {f.name: f for f in dataclasses.fields(ReplayOptions)}
    shared = [f for f in bounded if f.name in replay]
    assert {"batch_size", "read_ahead_bytes", "range_bytes", "starting_timestamp"} <= {f.name for f in shared}
    for f in shared:
        assert replay[f.name].metadata["bounds"] == f.metadata["bounds"]
        low, high, _ = f.metadata["bounds"]
        assert getattr(ReplayOptions(**{f.name: high}), f.name) == high
        for bad in (low - 1, high + 1):
            with pytest.raises(OptionError, match=f.name):
                ReplayOptions(**{f.name: bad})


@pytest.mark.parametrize(
    "raw, size",
    [("536870912", 512 << 20), ("512m", 512 << 20), ("512MB", 512 << 20), ("512 MiB", 512 << 20), ("4g", 4 << 30)]
    + [("64k", 64 << 10), ("64KiB", 64 << 10), ("1t", 1 << 40), ("7b", 7), ("0", 0)],
)
def test_a_byte_option_takes_a_size_as_spark_writes_one(raw: str, size: int) -> None:
    """Spark's units (spark.executor.memory=4g, Delta's maxBytesPerTrigger=1g) are powers
    of 1024 whether written k or kb; every option counted in bytes takes them."""
    checked = 0
    for field in ("max_bytes_per_trigger", "read_ahead_bytes", "range_bytes"):
        low, high, _ = next(f for f in dataclasses.fields(Options) if f.name == field).metadata["bounds"]
        if low <= size <= high:
            assert getattr(Options.parse({"path": "/a", camel(field): raw}), field) == size, field
            checked += 1
    assert checked, f"no byte option takes {size}"


@pytest.mark.parametrize(
    "options, named",
    [
        ({"batchSzie": "10"}, "unknown option batchSzie (batchSzie: did you mean batchSize?)"),
        ({"batchSize": "0"}, "batchSize='0'"),
        ({"rangeBytes": "-1"}, "rangeBytes='-1'"),
        ({"readAheadBytes": "lots"}, "readAheadBytes='lots': expected a number of bytes like 536870912, 512m"),
        ({"maxBytesPerTrigger": "1.5g"}, "maxBytesPerTrigger='1.5g': expected a number of bytes"),
        ({"maxSlicesPerTrigger": "1k"}, "maxSlicesPerTrigger='1k': expected a whole number"),
        ({"maxBytesPerTrigger": "-1g"}, "maxBytesPerTrigger='-1g'"),
        ({"startingSlice": "-3"}, "startingSlice='-3'"),
    ],
)
def test_a_bad_option_is_named(options: dict[str, str], named: str) -> None:
    with pytest.raises(DataSourceOptionError, match=re.escape(named)):
        Options.parse({"path": "/a", **options})


@pytest.mark.parametrize("cores, threads", [(1, 4), (2, 4), (3, 6), (8, 16), (16, 32), (96, 32)])
def test_the_replay_runs_two_threads_a_core_between_4_and_32(monkeypatch, cores, threads):
    """Reader threads only decode (GETs in flight are GET_THREADS whatever their count), and
    past ~2 a core they contend for it; the cores are those this process may use."""
    from reader import options

    monkeypatch.setattr(options.os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    assert options.default_threads() == threads


def test_the_replay_takes_each_of_its_options_as_a_typed_keyword_with_the_fields_default() -> None:
    """`reader.replay`'s keywords are ReplayOptions' fields, one each, with the same default:
    a field added to one and not the other would be a setting one surface cannot make."""
    import inspect

    import reader

    params = inspect.signature(reader.replay).parameters
    keywords = {n: p for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    fields = {f.name: f for f in dataclasses.fields(ReplayOptions)}
    assert set(keywords) - {"resume", "options", "store"} == set(fields)
    for name, f in fields.items():
        assert keywords[name].default == f.default, name
        assert keywords[name].annotation == f.type, name
    with pytest.raises(OptionError, match="not both"):
        reader.replay("/nowhere", options=ReplayOptions(), batch_size=7)
