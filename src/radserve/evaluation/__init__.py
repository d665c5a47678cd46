"""radserve.evaluation."""
