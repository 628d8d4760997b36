"""keyfill keyfill."""
