"""radserve.training."""
