"""radserve: on-premise radiology AI inference."""

__version__ = "0.1.0"
