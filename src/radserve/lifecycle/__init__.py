"""Model lifecycle in the running server: install bundles into the data dir, deploy a
stable / canary / shadow version per pipeline step, hot-swap between batches, compare
a shadow or canary with the serving version and roll back on guardrails, and check the
host (``radserve doctor``).

Modules, in the order a new model meets them: :mod:`.requirements` (what a bundle
needs of the host), :mod:`.install` (validate, hash, copy; :mod:`.version_commit`: files
radserve builds for an installed version, moved in crash-safely),
:mod:`radserve.domain.deployment` (who serves which step, how a study is routed),
:mod:`.manager` (the server's part: warm, switch, release, audit), :mod:`.compare` and
:mod:`.guardrails` (shadow/canary comparison, automatic rollback), :mod:`.doctor`
(environment check).
"""
