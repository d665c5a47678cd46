"""The name radserve writes as Manufacturer (0008,0070) of every result it makes, and by
which the intakes recognise those results when a PACS sends them back
(:mod:`radserve.gateway.own_results`). A constant of its own so that the intakes need not
import the report writers (highdicom, SciPy) to read it."""

MANUFACTURER = "radserve"
