"""radserve.report."""
