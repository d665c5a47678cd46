"""Plugins for the whole suite: ``tests/file_durations.py`` (with ``--durations``, the
slowest test files by summed wall time and their CPU-seconds)."""

pytest_plugins = ["tests.file_durations"]
