"""The write-rate arithmetic of bench/registry_writes.py (the capacity table it feeds is checked against the
docs in test_docs_results.py)."""

from __future__ import annotations

from bench.registry_writes import delta


def test_the_write_delta_counts_our_tables_apart_from_the_catalogs() -> None:
    before = {"xact_commit": 10, "xact_rollback": 0, "tup_inserted": 5, "tup_updated": 5, "tup_deleted": 0,
              "wal_bytes": 100, "tables": {"live_stats": 7, "drafts": 3}}
    after = {"xact_commit": 25, "xact_rollback": 1, "tup_inserted": 9, "tup_updated": 30, "tup_deleted": 1,
             "wal_bytes": 900, "tables": {"live_stats": 29, "drafts": 3, "locks": 1}}
    d = delta(after, before)
    assert d["rows_by_table"] == {"live_stats": 22, "locks": 1}  # tables nothing wrote are left out
    assert (d["rows_written"], d["rows_all"], d["xact_commit"], d["wal_bytes"]) == (23, 30, 15, 800)
