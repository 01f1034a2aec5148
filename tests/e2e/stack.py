"""The product's real processes for end-to-end tests (see launcher.stack), with what only the
tests read back."""

from __future__ import annotations

import sqlite3

from launcher import stack


class Stack(stack.Stack):
    def count_assistant_messages(self, request_id: str) -> list[tuple[str, str]]:
        """(status, text) of every stored answer for the request, read from the database."""
        with sqlite3.connect(self.db_path) as db:
            return db.execute(
                "SELECT g.status, g.text FROM chat_message m JOIN scheduler_generation g "
                "ON g.request_id = m.request_id WHERE m.request_id = ?",
                (request_id.replace("-", ""),),
            ).fetchall()
