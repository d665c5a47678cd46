"""radserve.inference."""
