"""Two destinations with one AE title (a primary archive and its DR copy at another
host:port) are refused at start with one line naming both. Before, one got every result
and the other none, and ``/deliveries`` said "ORTHANC sent" without telling which."""

from __future__ import annotations

import pytest

from radserve.config import DicomPeer, GatewaySettings
from radserve.gateway.config import destinations
from radserve.gateway.errors import GatewayConfigError


def _settings(*peers: DicomPeer) -> GatewaySettings:
    return GatewaySettings(enabled=True, allowed_peers=peers)


@pytest.mark.parametrize(("second_host", "second_port"), [("10.0.0.6", 104), ("10.0.0.5", 11112)])
def test_two_destinations_sharing_an_ae_title_are_refused_naming_both(
    second_host: str, second_port: int
) -> None:
    settings = _settings(
        DicomPeer("ORTHANC", "10.0.0.5", 104),
        DicomPeer("STORESCU", "10.0.0.7"),
        DicomPeer("ORTHANC", second_host, second_port),
    )
    with pytest.raises(GatewayConfigError) as raised:
        destinations(settings)
    message = str(raised.value)
    assert "\n" not in message
    assert f"ORTHANC@10.0.0.5:104 and ORTHANC@{second_host}:{second_port}" in message
    assert "share the AE title 'ORTHANC'" in message
    assert raised.value.code == "gateway_config_invalid"


def test_one_title_may_send_from_several_hosts_while_one_of_them_is_the_destination() -> None:
    settings = _settings(
        DicomPeer("ORTHANC", "10.0.0.5", 104),
        DicomPeer("ORTHANC", "10.0.0.6"),  # a second node that sends, gets nothing
    )
    [target] = destinations(settings)
    assert (target.name, target.host, target.port) == ("ORTHANC", "10.0.0.5", 104)


def test_the_same_destination_listed_twice_is_one_destination() -> None:
    settings = _settings(
        DicomPeer("ORTHANC", "10.0.0.5", 104), DicomPeer("ORTHANC", "10.0.0.5", 104)
    )
    assert [str(d) for d in destinations(settings)] == ["ORTHANC@10.0.0.5:104"]


def test_destinations_with_their_own_titles_each_get_results() -> None:
    settings = _settings(
        DicomPeer("ARCHIVE", "10.0.0.5", 104), DicomPeer("ARCHIVE_DR", "10.0.0.6", 104)
    )
    assert [d.name for d in destinations(settings)] == ["ARCHIVE", "ARCHIVE_DR"]
