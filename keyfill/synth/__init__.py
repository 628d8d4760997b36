"""Synthetic data for the example, the tests and the benchmarks: `keyfill generate`'s
payments archive, Kafka's default partitioner that places its keys, and a writer of the
Kafka Connect S3 sink layout. Nothing in the compaction or replay path imports this."""
