"""Replicas must configure the same destinations; this is where they compare them.

The lane share (:mod:`radserve.store.lane_share`) spreads each kind's destinations over
the servers alive on the assumption that every one of them knows the same destinations:
a destination only some replicas know, or one a replica sends to elsewhere (another
host, port or URL under the same name), goes wrong without a word. So at every lease
renewal each replica writes a digest per destination (``kind:name`` -> the first 16
hex of a SHA-256 over the settings that decide where its results go, never a secret)
into ``replica_destinations``, and reads the maps of the other replicas seen within
``within`` (a replica that stopped renewing is no longer compared). A map holds only
what that replica sends to, and a kind is compared only between replicas that both send
that kind (the lane share counts only the servers running a kind's lanes). What differs is
named by destination and replica, never by patient data: ``/readyz`` lists it (degraded)
and it is logged once whenever it changes (radserve.service.leases)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

from sqlalchemy import select

from radserve.store.base import StoreBase
from radserve.store.models import ReplicaDestinations
from radserve.store.records import utc_now


class ReplicaConfigMixin(StoreBase):
    """Replica destination digests of :class:`radserve.store.Store`."""

    def record_destinations(
        self,
        instance: str,
        destinations: Mapping[str, str],
        *,
        within: dt.timedelta,
        now: dt.datetime | None = None,
    ) -> dict[str, dict[str, str]]:
        """Write ``instance``'s destination digests (as of ``now``); the other replicas'
        maps written within ``within`` before it, by instance."""
        now = now or utc_now()
        with self._write(audited=False) as session:
            row = session.get(ReplicaDestinations, instance)
            if row is None:
                row = ReplicaDestinations(instance=instance)
                session.add(row)
            row.destinations, row.renewed = dict(destinations), now
            others = session.scalars(
                select(ReplicaDestinations).where(
                    ReplicaDestinations.instance != instance,
                    ReplicaDestinations.renewed >= now - within,
                )
            ).all()
            return {o.instance: dict(o.destinations) for o in others}


def differences(mine: Mapping[str, str], others: Mapping[str, Mapping[str, str]]) -> list[str]:
    """Each destination configured differently here and on another replica, in words:
    only of the kinds (``kind:`` of ``kind:name``) that both send to (a replica whose
    gateway is off sends no DICOM: the PACS it does not send to is no difference)."""
    out = []
    for instance, theirs in sorted(others.items()):
        both = _kinds(mine) & _kinds(theirs)
        for name in sorted(n for n in set(mine) | set(theirs) if _kind(n) in both):
            if name not in theirs:
                out.append(f"destination {name} is configured here but not on {instance}")
            elif name not in mine:
                out.append(f"destination {name} is configured on {instance} but not here")
            elif mine[name] != theirs[name]:
                out.append(f"destination {name} is configured differently on {instance}")
    return out


def _kind(name: str) -> str:
    return name.partition(":")[0]


def _kinds(destinations: Mapping[str, str]) -> set[str]:
    return {_kind(n) for n in destinations}


__all__ = ["ReplicaConfigMixin", "differences"]
