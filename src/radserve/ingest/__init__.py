"""radserve.ingest."""
