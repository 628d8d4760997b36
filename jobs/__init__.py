"""Scripts for `spark-submit` (compact, verify) and the worked examples (the fraud backfill,
the paced join), each runnable as a file on a cluster with keyfill's wheel."""
