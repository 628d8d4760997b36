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

from keygroups.lazy_names import names_from

# Where each public name is defined, imported on first use: pytest loads this package for its
# plugin (keyfill.testing.pytest_plugin, the `pytest11` entry point) in every pytest session of an
# environment keyfill is installed in, where hypothesis, numba, pyiceberg and pyspark may be
# absent (no [testing] extra) or slow to import.
_PUBLIC = {
    "LAYOUTS": "keyfill.synth.topic",
    "Record": "keyfill.synth.topic",
    "TopicArchive": "keyfill.synth.topic",
    "write_archive": "keyfill.synth.topic",
    "Backfill": "keyfill.testing.differential",
    "CheckResult": "keyfill.testing.differential",
    "DifferentialError": "keyfill.testing.differential",
    "check_job": "keyfill.testing.differential",
    "compact_example": "keyfill.testing.differential",
    "keyfill_replay": "keyfill.testing.differential",
    "MAX_WATERMARK": "keyfill.testing.reference",
    "Watermark": "keyfill.testing.reference",
    "late_in_partition": "keyfill.testing.reference",
    "live_order": "keyfill.testing.reference",
    "reference_stream": "keyfill.testing.reference",
    "SparkCheckResult": "keyfill.testing.spark",
    "check_spark_query": "keyfill.testing.spark",
    "BackfillSettings": "keyfill.testing.strategies",
    "backfill_settings": "keyfill.testing.strategies",
    "topic_archives": "keyfill.testing.strategies",
}


__getattr__ = names_from(globals(), _PUBLIC)

__all__ = sorted(_PUBLIC)
