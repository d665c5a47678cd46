"""C-MOVE and C-GET over DICOM TLS, from a real Query/Retrieve SCU (pynetdicom; dcmtk's
movescu and getscu speak no TLS), against the gateway with TLS on, in one process and
with receiving processes (TLS is then done in the receiving process).

radserve is no Query/Retrieve SCP (docs/conformance.md section 8): each Q/R context is
refused as "SOP class not supported" and the association goes on serving what it may
(a C-ECHO after it succeeds), the next peer is served, and the SCP's log says why in
words. Before (the first probe of these over TLS), the log's reason for a refused
C-MOVE context read "SOP class not supported (Explicit VR Big Endian (retired from
DICOM in 2004) is not accepted; send it in Explicit VR Little Endian)": the reason of a
transfer syntax the SCU also proposed, as though another syntax would have done."""

from __future__ import annotations

import logging
import ssl
from collections.abc import Iterator

import pytest
from pydicom.dataset import Dataset
from pynetdicom import AE, build_role
from pynetdicom.association import Association
from pynetdicom.sop_class import (
    CTImageStorage,
    PatientRootQueryRetrieveInformationModelGet,
    PatientRootQueryRetrieveInformationModelMove,
    StudyRootQueryRetrieveInformationModelGet,
    StudyRootQueryRetrieveInformationModelMove,
    Verification,
)
from tests.factories.tls import HAVE_OPENSSL, Pki, make_pki
from tests.factories.waits import wait_until

from radserve.config import TlsSettings
from radserve.gateway import GatewaySCP, ScpConfig
from radserve.gateway.config import Peer

pytestmark = pytest.mark.skipif(not HAVE_OPENSSL, reason="openssl is not installed")

SOP_CLASS_NOT_SUPPORTED = 0x03  # presentation context result (PS3.8 9.3.3.2)
MOVES = (StudyRootQueryRetrieveInformationModelMove, PatientRootQueryRetrieveInformationModelMove)
GETS = (StudyRootQueryRetrieveInformationModelGet, PatientRootQueryRetrieveInformationModelGet)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module", params=[1, 2], ids=["one-process", "receiving-processes"])
def tls_scp(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, pki: Pki
) -> Iterator[GatewaySCP]:
    config = ScpConfig(
        data_dir=tmp_path_factory.mktemp("gw"),
        port=0,
        quiet_s=0.5,
        receivers=request.param,
        tls=TlsSettings(cert=pki.server_cert, key=pki.server_key, ca=pki.ca),
        allowed_peers=(Peer("WORKSTATION", "127.0.0.1"),),
    )
    with GatewaySCP(config, lambda _study: None) as scp:
        yield scp


def associate(scp: GatewaySCP, pki: Pki, *contexts: str, get_storage: bool = False) -> Association:
    """A TLS association from WORKSTATION (client certificate of the test CA) proposing
    ``contexts`` (and CT storage with the SCP role, as a C-GET SCU does)."""
    tls = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(pki.ca))
    tls.load_cert_chain(str(pki.client_cert), str(pki.client_key))
    ae = AE(ae_title="WORKSTATION")
    ae.acse_timeout = ae.dimse_timeout = ae.network_timeout = 10
    for uid in contexts:
        ae.add_requested_context(uid)
    roles = []
    if get_storage:
        ae.add_requested_context(CTImageStorage)
        roles = [build_role(CTImageStorage, scp_role=True)]
    host, port = scp.address
    return ae.associate(host, port, ae_title="RADSERVE", tls_args=(tls, "localhost"), ext_neg=roles)


def query() -> Dataset:
    ds = Dataset()
    ds.QueryRetrieveLevel = "STUDY"
    ds.StudyInstanceUID = "1.2.826.0.1.3680043.8.498.1"
    return ds


@pytest.mark.parametrize("model", MOVES + GETS, ids=lambda uid: uid.name)
def test_a_retrieve_over_tls_is_refused_and_the_association_still_serves(
    tls_scp: GatewaySCP, pki: Pki, model: str
) -> None:
    is_get = model in GETS
    assoc = associate(tls_scp, pki, model, Verification, get_storage=is_get)
    assert assoc.is_established
    try:
        [refused] = assoc.rejected_contexts
        assert (refused.abstract_syntax, refused.result) == (model, SOP_CLASS_NOT_SUPPORTED)
        with pytest.raises(ValueError, match="No presentation context"):
            if is_get:
                list(assoc.send_c_get(query(), model))
            else:
                list(assoc.send_c_move(query(), "WORKSTATION", model))
        assert assoc.send_c_echo().Status == 0x0000  # the association still serves
    finally:
        assoc.release()


@pytest.mark.parametrize("model", [MOVES[0], GETS[0]], ids=["C-MOVE", "C-GET"])
def test_the_scp_log_says_radserve_serves_no_query_retrieve(
    tls_scp: GatewaySCP, pki: Pki, model: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="radserve.gateway")
    assoc = associate(tls_scp, pki, model)  # nothing else: nothing can be accepted
    assert not assoc.is_established
    said = lambda: [  # noqa: E731
        r.getMessage() for r in caplog.records if "none accepted" in r.getMessage()
    ]
    assert wait_until(lambda: said(), timeout=10)
    [line] = said()
    assert "'WORKSTATION'" in line and model.name in line, line
    assert "SOP class not supported (radserve is no Query/Retrieve SCP: it takes" in line, line
    assert "Big Endian (retired" not in line, line  # no transfer syntax was at fault
    echo = associate(tls_scp, pki, Verification)  # the next peer is served
    assert echo.is_established and echo.send_c_echo().Status == 0x0000
    echo.release()
