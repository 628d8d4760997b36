"""keyfill jobs."""
