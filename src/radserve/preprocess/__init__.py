"""radserve.preprocess."""
