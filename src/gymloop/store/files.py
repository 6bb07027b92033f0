"""The fine-tuning service's uploaded files, their bytes included (a job never loses its data).
Every row names its tenant (the API key's id); a lookup with another tenant finds nothing."""
from __future__ import annotations

import time
import uuid

from .db import Database, page
from .records import FileRecord

_COLS = "id, seq, tenant, created, filename, purpose, bytes, status, status_details, kind, examples"


class Files:
    def __init__(self, db: Database) -> None:
        self.db = db

    def add(self, *, tenant: str, filename: str, purpose: str, content: bytes, status: str,
            status_details: str | None, kind: str | None, examples: int | None = None) -> FileRecord:
        fid = f"file-{uuid.uuid4().hex[:24]}"
        with self.db.tx() as c:
            c.execute("INSERT INTO files (id, tenant, created, filename, purpose, bytes, status, status_details, "
                      "kind, examples, content) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                      (fid, tenant, time.time(), filename, purpose, len(content), status, status_details, kind,
                       examples, content))
        return self.get(tenant, fid)

    def get(self, tenant: str, file_id: str) -> FileRecord | None:
        row = self.db.read().execute(f"SELECT {_COLS} FROM files WHERE id = ? AND tenant = ?",
                                     (file_id, tenant)).fetchone()
        return None if row is None else dict(row)

    def content(self, tenant: str, file_id: str) -> bytes | None:
        row = self.db.read().execute("SELECT content FROM files WHERE id = ? AND tenant = ?",
                                     (file_id, tenant)).fetchone()
        return None if row is None else bytes(row["content"])

    def list(self, tenant: str, *, after: str | None = None, limit: int = 20,
             purpose: str | None = None) -> tuple[list[FileRecord], bool]:
        """Newest first; `after`: a file id, the page continues below it. Returns (rows, has_more)."""
        return page(self.db, "files", _COLS, tenant, after, limit, ("purpose", purpose))

    def delete(self, tenant: str, file_id: str) -> bool:
        with self.db.tx() as c:
            return c.execute("DELETE FROM files WHERE id = ? AND tenant = ?", (file_id, tenant)).rowcount == 1
