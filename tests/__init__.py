"""radserve tests."""
