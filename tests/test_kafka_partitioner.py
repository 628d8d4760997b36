"""Kafka's default partitioner: murmur2 as the Java client computes it."""

from hypothesis import given, settings
from hypothesis import strategies as st

from keyfill.synth.kafka_partitioner import kafka_partition, kafka_partitions, murmur2, murmur2_many

# Values asserted by Kafka's own UtilsTest.testMurmur2 (Java ints).
KAFKA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


def test_murmur2_matches_kafka_vectors():
    for key, expected in KAFKA_VECTORS.items():
        assert murmur2(key) == expected


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=40), max_size=50), st.integers(1, 1000))
def test_vectorised_partitioner_equals_scalar(keys, partitions):
    many = murmur2_many(keys)
    assert [int(h) for h in many] == [murmur2(k) & 0xFFFFFFFF for k in keys]
    assert kafka_partitions(keys, partitions).tolist() == [kafka_partition(k, partitions) for k in keys]
