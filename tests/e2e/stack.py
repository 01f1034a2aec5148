"""The product's real processes for end-to-end tests (see launcher.stack), with what only the
tests read back."""

from __future__ import annotations

import sqlite3

from launcher import stack


class Stack(stack.Stack):
    def count_assistant_messages(self, request_id: str) -> list[tuple[str, str]]:
        """(status, content) of every stored message for the request, read from the database."""
        with sqlite3.connect(self.db_path) as db:
            return db.execute(
                "SELECT status, content FROM chat_message WHERE request_id = ?",
                (request_id.replace("-", ""),),
            ).fetchall()
