"""keyfill compactor."""
