"""Moving a stored folder: every row that names it, or a file in it, follows.

Used when storage fails back (radserve.service.failover): a study or result folder
written to the local fallback while the shared data folder was away is copied into the
data folder, and then, in one transaction, the job rows (``study_path``,
``result_path``), the outbox rows and the result instance index (``path`` of files
inside it) are pointed at the copy. Until that commit every reader still uses the old
folder, which is deleted only afterwards.
"""

from __future__ import annotations

from sqlalchemy import func, literal, select, update

from radserve.store.base import StoreBase
from radserve.store.models import Job, OutboxDelivery, ResultInstance


class RelocateMixin(StoreBase):
    """Folder relocation of :class:`radserve.store.Store`."""

    def rows_naming(self, folder: str) -> list[tuple[str, str]]:
        """``(job id, state)`` of the jobs whose study or result is ``folder``."""
        with self._read() as session:
            rows = session.execute(
                select(Job.id, Job.state).where(
                    (Job.study_path == folder) | (Job.result_path == folder)
                )
            ).all()
        return [(r[0], r[1]) for r in rows]

    def relocate(self, old: str, new: str) -> list[str]:
        """Point every row naming ``old`` (or a file under it) at ``new``; the ids of the
        jobs changed (their cached records are stale)."""
        old, new = old.rstrip("/"), new.rstrip("/")
        prefix = old + "/"
        with self._write(audited=False) as session:
            ids = {
                r[0]
                for r in session.execute(
                    update(Job)
                    .where(Job.study_path == old)
                    .values(study_path=new)
                    .returning(Job.id)
                    .execution_options(synchronize_session=False)
                ).all()
            }
            ids |= {
                r[0]
                for r in session.execute(
                    update(Job)
                    .where(Job.result_path == old)
                    .values(result_path=new)
                    .returning(Job.id)
                    .execution_options(synchronize_session=False)
                ).all()
            }
            for table in (OutboxDelivery, ResultInstance):
                session.execute(
                    update(table)
                    .where(table.path.startswith(prefix, autoescape=True))
                    .values(path=literal(new) + func.substr(table.path, len(old) + 1))
                    .execution_options(synchronize_session=False)
                )
        return sorted(ids)


__all__ = ["RelocateMixin"]
