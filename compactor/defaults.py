"""The compaction's defaults, declared once: `CompactConfig` and the command line both read
them here. A module without imports, so that `keyfill --help` does not load pyarrow."""

SOURCE_FORMAT = "envelope"
CODEC = "snappy"  # Avro codec of segment files
BLOCK_BYTES = 1 << 20  # largest Avro block of a segment file
TARGET_FILE_BYTES = 64 << 20  # a segment file is cut at the first slice boundary past this size
IO_THREADS = 16  # I/O threads per task
