"""`keyfill report`: a self-contained HTML page whose pictures are real PNGs embedded in it,
and the per-partition held-back counts it draws equal the source records beyond each
partition's hand-off."""

from __future__ import annotations

import base64
import io
from html.parser import HTMLParser

import numpy as np
import pytest

from compactor.job import CompactConfig, compact
from keyfill.cli import main
from keyfill.synth.generate import GeneratorConfig, generate
from keygroups import compacted
from keygroups.storage import open_storage
from tests.test_reader import source_table


class Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: list[dict] = []
        self.links: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "img":
            self.images.append(a)
        for name in ("href", "src"):
            if a.get(name) and not a[name].startswith("data:"):
                self.links.append(a[name])

    def handle_data(self, data):
        self.text.append(data)


@pytest.fixture(scope="module")
def archive(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    src, dest = str(root / "src"), str(root / "c")
    generate(
        GeneratorConfig(out=src, records=40_000, keys=500, partitions=3, chunk_records=4_000, rate=50.0, seed=11),
        progress=False,
    )
    result = compact(CompactConfig(source=src, dest=dest, groups=6, slice_duration="1m"), spark)
    return src, dest, result


def test_held_back_by_partition_is_what_lies_beyond_each_hand_off(archive):
    src, dest, result = archive
    manifest = compacted.load_manifest(open_storage(dest))
    table = source_table(src)
    parts, offsets = table.column("partition").to_numpy(), table.column("offset").to_numpy()
    beyond = {p: int(((parts == p) & (offsets >= o)).sum()) for p, o in manifest.handoff.items()}
    assert result.withheld > 0  # the fixture holds records back, so the check below means something
    assert {p: n for p, n in beyond.items() if n} == manifest.held_back
    assert sum(manifest.held_back.values()) == result.withheld


def test_the_report_is_one_html_file_with_its_pictures_inside(archive, tmp_path, capsys):
    import matplotlib.image

    _, dest, result = archive
    out = str(tmp_path / "report.html")
    assert main(["report", dest, "--out", out, "--replay-seconds", "60", "--threads", "3"]) == 0
    assert out in capsys.readouterr().out
    page = Page()
    with open(out, encoding="utf-8") as f:
        page.feed(f.read())
    assert page.links == []  # nothing outside the file: it opens copied anywhere
    alts = [img["alt"] for img in page.images]
    assert alts == ["Group balance", "Bytes per slice over event time", "Records held back", "Replay throughput"]
    for img in page.images:
        head, _, data = img["src"].partition(",")
        assert head == "data:image/png;base64"
        pixels = matplotlib.image.imread(io.BytesIO(base64.b64decode(data)), format="png")
        assert pixels.shape[0] > 100 and pixels.shape[1] > 300
        assert np.ptp(pixels) > 0  # something is drawn on it
    text = " ".join(page.text)
    assert f"{result.records:,}" in text  # the summary table and the whole replay's caption
    assert "the whole archive" in text  # the replay finished within its 60 s
    assert f"{result.withheld:,} records of slices not sealed yet" in text


def test_a_report_without_a_replay_and_a_bad_archive(archive, tmp_path, capsys):
    _, dest, _ = archive
    out = str(tmp_path / "r.html")
    assert main(["report", dest, "--out", out, "--replay-seconds", "0", "--json"]) == 0
    assert '"replay_records_per_second": null' in capsys.readouterr().out
    page = Page()
    with open(out, encoding="utf-8") as f:
        page.feed(f.read())
    assert len(page.images) == 3
    assert main(["report", str(tmp_path / "nothing"), "--out", out]) == 2
    assert "nothing" in capsys.readouterr().err
