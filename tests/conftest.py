"""Plugins for the whole suite: ``tests/file_durations.py`` (with ``--durations``, the
slowest test files by summed wall time and their CPU-seconds) and ``tests/leftovers.py``
(processes a test module left running are stopped after it and named at the end)."""

pytest_plugins = ["tests.file_durations", "tests.leftovers"]
