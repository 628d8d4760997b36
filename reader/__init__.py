"""keyfill reader."""
