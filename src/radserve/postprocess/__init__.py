"""radserve.postprocess."""
