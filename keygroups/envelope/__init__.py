"""The envelope record: one Kafka record as keyfill stores it, in source archives and in
compacted archives alike (see docs/envelope-archive.md), and its Avro codec.

Records travel as Arrow record batches (`ARROW_SCHEMA`) and are stored as Avro object
container files. Modules: `schema` (Avro and Arrow schemas, conform, record weights),
`framing` (container header, blocks, varints, codecs: shared by every decoder),
`buffers` (Arrow binary columns <-> numpy buffers), `encoder` and `decoder` (compiled),
`fingerprints` (record digests). The tests prove the decoder equal to fastavro's
(tests/avro_reference.py).
"""

from keygroups.envelope.decoder import decode_avro, decode_encoded
from keygroups.envelope.encoder import (
    avro_header,
    blocks_of,
    encode_avro,
    encode_blocks,
    encode_records,
    encoded_batch,
)
from keygroups.envelope.fingerprints import record_fingerprints
from keygroups.envelope.framing import (
    ERR_EOF,
    ERR_NEGATIVE,
    ERR_UNION,
    read_avro_metadata,
    read_block_count,
    read_bytes,
    read_varint,
)
from keygroups.envelope.schema import (
    ARROW_SCHEMA,
    AVRO_SCHEMA,
    CODECS,
    DEFAULT_BLOCK_BYTES,
    ENCODED_SCHEMA,
    HEADER_TYPE,
    PARSED_SCHEMA,
    batch_from_records,
    conform,
    empty_batch,
    record_bytes,
)
from keygroups.errors import CorruptFile, HeaderTruncated

__all__ = [
    "ARROW_SCHEMA",
    "AVRO_SCHEMA",
    "CODECS",
    "DEFAULT_BLOCK_BYTES",
    "ENCODED_SCHEMA",
    "HEADER_TYPE",
    "PARSED_SCHEMA",
    "ERR_EOF",
    "ERR_NEGATIVE",
    "ERR_UNION",
    "CorruptFile",
    "HeaderTruncated",
    "batch_from_records",
    "conform",
    "decode_avro",
    "decode_encoded",
    "empty_batch",
    "encode_avro",
    "encode_blocks",
    "encode_records",
    "encoded_batch",
    "blocks_of",
    "avro_header",
    "read_avro_metadata",
    "read_block_count",
    "read_bytes",
    "read_varint",
    "record_bytes",
    "record_fingerprints",
]
