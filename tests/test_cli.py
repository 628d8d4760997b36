"""The `keyfill` command as users run it: help, generate, inspect, errors and exit codes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from keyfill.cli import build_parser, main
from keyfill.cli.versions import rows as versions_rows
from keygroups.storage import open_storage
from reader.options import ReplayOptions

SUBCOMMANDS = ["generate", "inspect", "compact", "verify", "replay"]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "keyfill", *args], capture_output=True, text=True, timeout=300)


def test_help_lists_every_subcommand():
    out = run("--help")
    assert out.returncode == 0
    for name in SUBCOMMANDS:
        assert name in out.stdout


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_each_subcommand_has_help(name, capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args([name, "--help"])
    assert exit_.value.code == 0
    assert "usage: keyfill " + name in capsys.readouterr().out


def test_generate_then_inspect_on_both_backends(storage_url, capsys):
    assert (
        main(
            [
                "generate",
                "--out",
                storage_url,
                "--records",
                "5000",
                "--keys",
                "50",
                "--partitions",
                "3",
                "--chunk-records",
                "1000",
                "--no-progress",
                "--json",
            ]
        )
        == 0
    )
    written = json.loads(capsys.readouterr().out)
    assert written["records"] == 5000 and written["chunks"] >= 5
    assert main(["inspect", storage_url, "--json", "--top", "3"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["records"] == 5000
    assert sorted(p["partition"] for p in summary["partitions"]) == [0, 1, 2]
    assert summary["chunks"] == written["chunks"]
    top = summary["heaviest_keys"]
    assert len(top) == 3 and top[0]["bytes"] >= top[1]["bytes"] >= top[2]["bytes"]
    assert top[0]["key"] == "user-00000000"  # the Zipf head
    assert main(["inspect", storage_url, "--no-scan"]) == 0
    text = capsys.readouterr().out
    assert "5,000 in" in text and "payments" in text


@pytest.mark.parametrize(
    "args, message",
    [
        (["inspect", "gs://bucket/x"], "gs://bucket/x"),
        (["inspect", "{tmp}/nothing-here"], "no envelope chunks"),
        (["generate", "--out", "{tmp}/g", "--null-keys", "2"], "not a fraction"),
        (["generate", "--out", "{tmp}/g", "--codec", "lz4"], "invalid choice"),
    ],
)
def test_bad_input_exits_non_zero_with_a_named_error(tmp_path, args, message):
    out = run(*[a.format(tmp=tmp_path) for a in args])
    assert out.returncode != 0
    assert message in out.stderr
    assert "Traceback" not in out.stderr


def test_format_choices_and_flags_come_from_the_source_registry(capsys):
    from compactor.sources import FORMATS

    for command in ("compact", "inspect", "verify"):
        with pytest.raises(SystemExit):
            build_parser().parse_args([command, "--help"])
        help_text = re.sub(r"-\s", "-", " ".join(capsys.readouterr().out.split()))  # argparse wraps after hyphens
        assert "{" + ",".join(FORMATS) + "}" in help_text
        first: dict[str, str] = {}  # a flag -> the first format that takes it (its group shows it)
        for name, source in FORMATS.items():
            for o in source.Options.options():
                owner = first.setdefault(o.flag, name)
                assert f"options of --format {owner}:" in help_text and f"{o.flag}" in help_text
                assert f"{owner}: {' '.join(o.help.split())}" in help_text  # says which format it is for
                if owner != name:  # an option two formats share: one flag, its help naming both
                    assert f"(also --format {name})" in help_text
    args = build_parser().parse_args(["compact", "s", "d", "--format", "kafka-connect", "--timestamp-field", "ts"])
    from keyfill.cli import compact_config

    cfg = compact_config(args)
    assert (cfg.source_options.timestamp_field, cfg.source_options.allow_dropped) == ("ts", False)


@pytest.mark.parametrize(
    "args",
    [
        ["compact", "{tmp}/s", "{tmp}/d", "--key-field", "user"],
        ["compact", "{tmp}/s", "{tmp}/d", "--format", "iceberg", "--allow-dropped"],
        ["inspect", "{tmp}/s", "--timestamp-field", "ts"],
        ["verify", "{tmp}/s", "{tmp}/d", "--format", "kafka-segments", "--key-field", "user"],
    ],
)
def test_a_flag_of_another_format_is_refused_naming_it(tmp_path, args, capsys):
    flag = next(a for a in args if a.startswith("--") and a != "--format")
    assert main([a.format(tmp=tmp_path) for a in args]) == 2
    err = capsys.readouterr().err
    assert f"{flag} (" in err and "is an option of --format kafka-connect" in err


def test_missing_bucket_is_named(s3_server, capsys):
    assert main(["inspect", "s3://no-such-bucket-here/x", "--no-progress"]) == 2
    assert "no-such-bucket-here" in capsys.readouterr().err


def test_generate_refuses_to_overwrite_without_flag(tmp_path, capsys):
    args = ["generate", "--out", str(tmp_path), "--records", "100", "--keys", "5", "--no-progress"]
    assert main(args) == 0
    assert main(args) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main([*args, "--overwrite"]) == 0


def truncated_chunk_archive(root):
    """A small null-codec archive whose second chunk is cut short; returns that chunk."""
    args = "--records 3000 --keys 5 --partitions 1 --chunk-records 1000 --codec null --no-progress".split()
    assert main(["generate", "--out", str(root), *args]) == 0
    victim = sorted((root / "payments" / "partition=0").iterdir())[1]
    victim.write_bytes(victim.read_bytes()[:-3000])
    return victim


def test_corrupt_chunk_is_named_by_inspect(tmp_path, capsys):
    victim = truncated_chunk_archive(tmp_path)
    capsys.readouterr()
    assert main(["inspect", str(tmp_path), "--no-progress"]) == 2
    assert victim.name in capsys.readouterr().err


def test_compact_and_verify_commands_end_to_end(spark, tmp_path, capsys):
    """The first compaction as users run it (`python -m keyfill`, its own Spark); the rest in
    this process, where the commands run on the test's Spark session and leave it running."""
    src, dest = str(tmp_path / "src"), str(tmp_path / "c")
    assert (
        main(
            [
                "generate",
                "--out",
                src,
                "--records",
                "4000",
                "--keys",
                "30",
                "--partitions",
                "2",
                "--chunk-records",
                "1000",
                "--no-progress",
            ]
        )
        == 0
    )
    out = run("compact", src, dest, "--groups", "3", "--slice-duration", "1m", "--master", "local[2]", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    # only sealed slices are published: the rest waits at the hand-off offsets
    assert result["records"] + result["withheld"] == 4000 and result["withheld"] >= 1 and result["groups"] == 3
    (committed,) = versions_rows(open_storage(dest))  # the run and archive `keyfill versions` shows
    assert (result["run"], result["archive"], result["version"]) == (committed["run"], committed["archive"], 1)
    capsys.readouterr()
    assert main(["verify", src, dest, "--spark", "--master", "local[2]"]) == 0
    assert f"verified: {result['records']:,} records" in capsys.readouterr().out
    assert spark.range(3).count() == 3  # the session the command ran on is still running
    checkpoint = tmp_path / "replay.json"
    out = run("replay", dest, "--threads", "3", "--checkpoint-file", str(checkpoint), "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["records"] == result["records"]
    assert json.loads(out.stdout)["read_ahead_peak_bytes"] > 0
    assert json.loads(checkpoint.read_text())["slice"] == result["slices"]
    out = run("replay", dest, "--checkpoint-file", str(checkpoint), "--json")  # resumes at the end
    assert json.loads(out.stdout) | {"seconds": 0, "records_per_second": 0} == {
        "records": 0,
        "seconds": 0,
        "records_per_second": 0,
        "watermark": None,
        "threads": ReplayOptions().threads,  # the default: 2 a core, between 4 and 32
        "resumed": True,
        "max_spread_ms": 0,
        "read_ahead_peak_bytes": 0,  # nothing left to read: nothing held
    }
    # a damaged segment file: verify exits 1 and names it
    victim = sorted((tmp_path / "c" / "groups").rglob("*.avro"))[0]
    victim.write_bytes(victim.read_bytes()[:-20])
    out = run("verify", src, dest, "--no-progress")
    assert out.returncode == 1 and victim.name in out.stdout and "FAIL checksums" in out.stdout
    # an unversioned archive (format 2, never released: one _manifest.json) is refused in one
    # line by a reader and by a compaction, --overwrite or not, and left as it is
    versions = tmp_path / "c" / "_versions"
    manifest = json.loads(max(versions.iterdir()).read_text())
    shutil.rmtree(versions)
    legacy = tmp_path / "c" / "_manifest.json"
    legacy.write_text(json.dumps(manifest | {"format_version": 2}))
    refusal = "compacted with an older keyfill (format version 2; this one reads version 3)"
    out = run("replay", dest, "--no-progress")
    assert out.returncode == 2 and refusal in out.stderr and len(out.stderr.strip().splitlines()) == 1
    out = run("compact", src, dest, "--groups", "3", "--master", "local[2]", "--overwrite")
    assert out.returncode == 2 and refusal in out.stderr.strip().splitlines()[-1]
    assert legacy.exists() and not versions.exists()
    assert spark.range(3).count() == 3


def test_inspect_describes_a_compacted_archive(spark, tmp_path, capsys):
    src, dest = str(tmp_path / "src"), str(tmp_path / "c")
    assert main(["generate", "--out", src, "--records", "3000", "--keys", "20", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["compact", src, dest, "--groups", "2", "--slice-duration", "30s", "--seal-all", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert main(["inspect", dest, "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["format_version"] == 3 and s["version"] == 1 and s["records"] == 3000 and s["groups"] == 2
    assert (s["slices"], s["files"], s["pieces"]) == (result["slices"], result["files"], result["pieces"])
    assert main(["inspect", dest]) == 0
    assert "segment files" in capsys.readouterr().out


def test_version_is_the_installed_distributions(capsys):
    from importlib.metadata import version

    import keyfill

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"keyfill {version('keyfill')}" == f"keyfill {keyfill.__version__}"


def _cli_sections() -> dict[str, str]:
    """docs/cli.md's text under each `## \\`keyfill NAME\\`` heading, by NAME (its ### parts included)."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text()
    found = {}
    for part in re.split(r"^## ", doc, flags=re.M)[1:]:
        head, _, body = part.partition("\n")
        m = re.fullmatch(r"`keyfill ([a-z-]+)`", head.strip())
        if m:
            found[m.group(1)] = body
    return found


def test_the_cli_page_is_the_parsers_options_for_every_subcommand():
    """docs/cli.md is the CLI reference: a section per subcommand `keyfill --help` lists, each
    with its options table as `keyfill.cli.reference` writes it from the parser (run `python
    -m keyfill.cli.reference docs/cli.md` after changing an option); every --flag the page
    names is an option of some subcommand."""
    from keyfill.cli import reference

    page = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text()
    assert reference.rewrite(page) == page, (
        "docs/cli.md's option tables are stale: python -m keyfill.cli.reference docs/cli.md"
    )
    sections = _cli_sections()
    commands = reference.subcommands()
    lacking = [name for name in commands if f"<!-- options: {name} -->" not in sections.get(name, "")]
    assert not lacking, f"docs/cli.md has no section with an options table for: {lacking}"
    every = {s for a in build_parser()._actions for s in a.option_strings}
    every |= {s for c in commands.values() for a in c._actions for s in a.option_strings}
    cited = set(re.findall(r"`(--[a-z][a-z0-9-]*)", page)) - {"--py-files"}  # spark-submit's, beside keyfill's
    assert cited <= every, f"docs/cli.md names options no subcommand has: {sorted(cited - every)}"
