"""Coverage-guided fuzzing (atheris, libFuzzer) of radserve's hostile-input surfaces.

One target per surface under :mod:`tests.fuzz.targets`, each calling what the doors call
(docs/fuzzing.md lists them). The invariant (:func:`tests.fuzz.invariant.refusals_only`):
bad input ends in one of radserve's declared refusals, a
:class:`~radserve.errors.RadserveError` with a code and a message (or the surface's own
documented outcome); any other exception, a timeout or an RSS over the limit is a finding.

Modes: ``test_fuzz_targets.py`` runs each target a fixed number of inputs from its seed
corpus (CI); ``make fuzz`` (``python -m tests.fuzz.long``) runs each for minutes and keeps
the crashes."""
