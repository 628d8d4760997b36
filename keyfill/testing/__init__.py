"""Property tests for your own streaming job: does it give, fed by keyfill's backfill, what it
gives fed the topic in Kafka's partition order? (`pip install keyfill[testing]`; docs/testing.md)

    from hypothesis import given
    from keyfill.testing import backfill_settings, check_job, topic_archives

    @given(archive=topic_archives(), settings=backfill_settings())
    def test_my_job_backfills_as_it_runs_live(archive, settings):
        check_job(my_job, archive, settings)

For a Spark query, `check_spark_query` (needs keyfill[spark]). Pytest fixtures
(`keyfill_spark`, `keyfill_s3`) come with the package's pytest plugin.
"""

from keyfill.synth.topic import LAYOUTS, Record, TopicArchive, write_archive
from keyfill.testing.differential import (
    Backfill,
    CheckResult,
    DifferentialError,
    check_job,
    compact_example,
    keyfill_replay,
)
from keyfill.testing.reference import MAX_WATERMARK, Watermark, late_in_partition, live_order, reference_stream
from keyfill.testing.spark import SparkCheckResult, check_spark_query
from keyfill.testing.strategies import BackfillSettings, backfill_settings, topic_archives

__all__ = [
    "LAYOUTS",
    "MAX_WATERMARK",
    "Backfill",
    "BackfillSettings",
    "CheckResult",
    "SparkCheckResult",
    "DifferentialError",
    "Record",
    "TopicArchive",
    "Watermark",
    "backfill_settings",
    "check_job",
    "check_spark_query",
    "compact_example",
    "keyfill_replay",
    "late_in_partition",
    "live_order",
    "reference_stream",
    "topic_archives",
    "write_archive",
]
