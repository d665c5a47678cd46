"""DICOMweb (PS3.18): the protocol side of STOW-RS, WADO-RS and QIDO-RS.

- :mod:`.multipart`: ``multipart/related`` bodies (a streaming reader for STOW-RS
  requests, the writer of WADO-RS responses) and Accept negotiation;
- :mod:`.stow`: each part checked (Part-10, SOP class, transfer syntax, target study),
  studies handed to the server or filed for the quiet period, the Store Instances
  Response;
- :mod:`.wado`: radserve's result instances by study/series/instance UID, and their
  metadata as DICOM JSON;
- :mod:`.qido`: searches over those results;
- :mod:`.index`: the result index rows (from each result file's header) that WADO-RS
  and QIDO-RS read.

The HTTP routes are a thin FastAPI adapter in :mod:`radserve.api.routes.dicomweb`
(authentication, audit, status codes, OpenAPI document), kept in ``api/`` with the other
routers because they share its keys, roles, audit and error table. The server binds
STOW-RS to its intake in :mod:`radserve.service.dicomweb`. The index table itself is
persisted by :mod:`radserve.store.results` with the rest of the database.
"""
