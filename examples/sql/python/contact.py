"""A contact form's handler with psycopg 3: the message is stored and the
recipient's limit taken in one transaction, so that a refused message
leaves no row and a stored one is always counted.

    DATABASE_URL=postgres://contact_app@host/app python contact.py RECIPIENT SENDER BODY [TIMES]

Prints one line per attempt: "sent ID" or "refused, retry after N s".
"""

import json
import os
import sys
from dataclasses import dataclass

import psycopg
from psycopg.types.json import Jsonb


@dataclass
class Sent:
    id: int


@dataclass
class Refused:
    retry_after_s: int


def send_contact_message(conn: psycopg.Connection, recipient: str, sender: str, body: str) -> Sent | Refused:
    """Stores one message unless the contact policy refuses its recipient."""
    try:
        # One transaction: committed on leaving the block, rolled back by the exception.
        with conn.transaction():
            row = conn.execute(
                "INSERT INTO contact_messages (recipient, sender, body) VALUES (%s, %s, %s) RETURNING id",
                (recipient, sender, body),
            ).fetchone()
            assert row is not None
            # The check comes last and waits at most 2 s for the recipient's
            # row, which it keeps locked until COMMIT.
            conn.execute("SET LOCAL lock_timeout = '2s'")
            conn.execute("SELECT * FROM pglimit.enforce('contact', %s)", (Jsonb({"recipient": recipient}),))
            return Sent(row[0])
    except psycopg.Error as e:
        if e.diag.sqlstate != "RL429":
            raise
        # DETAIL is JSON: retry_after_s, reset_at, limit, remaining, buckets.
        detail = json.loads(e.diag.message_detail or "{}")
        return Refused(detail["retry_after_s"])


def main() -> None:
    if "DATABASE_URL" not in os.environ or len(sys.argv) not in (4, 5):
        sys.exit("usage: DATABASE_URL=postgres://... python contact.py RECIPIENT SENDER BODY [TIMES]")
    recipient, sender, body = sys.argv[1:4]
    times = int(sys.argv[4]) if len(sys.argv) == 5 else 1
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        for _ in range(times):
            result = send_contact_message(conn, recipient, sender, body)
            if isinstance(result, Sent):
                print(f"sent {result.id}")
            else:
                print(f"refused, retry after {result.retry_after_s} s")


if __name__ == "__main__":
    main()
