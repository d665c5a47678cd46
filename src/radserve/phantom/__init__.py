"""radserve.phantom."""
