"""The composition root of the jobs stores: the one place that picks the jobs store for the billing
store's database handle; jobs/store.py, the interface, imports neither implementation."""

from __future__ import annotations

from billing.postgres_pool import PostgresPool
from billing.sqlite_thread import SQLiteThread
from billing.store import Store
from jobs.postgres import PostgresJobStore
from jobs.sqlite import SQLiteJobStore
from jobs.store import JobStore, JobStoreError


def open_job_store(store: Store, files_dir: str = "") -> JobStore:
    """The jobs store on the billing store's database handle. ``files_dir``: where the SQLite store
    keeps file contents (empty: a ``files`` directory beside the database file)."""
    db = store.database
    if isinstance(db, SQLiteThread):
        return SQLiteJobStore(db, files_dir)
    if isinstance(db, PostgresPool):
        return PostgresJobStore(db)
    raise JobStoreError(f"the Batch API has no store for a {db.dialect} database")
