"""FHIR over the network: the HTTP delivery of each job's Bundle to a FHIR server
(:mod:`radserve.fhir.delivery`), through the durable outbox the DICOM results use.

The Bundle itself is built by :mod:`radserve.report.fhir` (pure: the report stage does
no network); :mod:`radserve.service.fhir` wires delivery into the server. This package
sits beside :mod:`radserve.gateway` (DICOM DIMSE and DICOMweb): one home per protocol.
"""
