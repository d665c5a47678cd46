"""radserve.bench."""
