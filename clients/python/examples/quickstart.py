"""The blocking client: a lock around fenced work, a renewed lease, and an
acquire that only takes a free key.

    BATON_SERVERS=127.0.0.1:7373 python quickstart.py

The tests run it against a real batond, and CI type-checks it with
``mypy --strict`` against the installed wheel.
"""

import os

import baton_locks


def write_batch(batch: int, fence: int) -> None:
    # A real store refuses a write whose fence is older than the last one.
    print("batch %d written with fence %d" % (batch, fence))


def main() -> None:
    servers = os.environ.get("BATON_SERVERS", "127.0.0.1:7373")
    with baton_locks.Client(servers) as client:
        # Wait up to 10 s in line; the grant lasts 30 s unless released or kept.
        with client.lock("invoices", lease=30, wait=10) as grant:
            for batch in range(3):
                write_batch(batch, fence=grant.token)
                client.keep(grant, 30)  # long job: renew the lease

        try:
            backup = client.acquire("backup", lease=600, wait=0)  # only if free now
        except baton_locks.Timeout:
            print("someone else is running the backup")
        else:
            print("backup running with fence %d" % backup.token)
            client.release(backup)

        status = client.query("invoices")
        print("invoices free again: %s" % status.free)


if __name__ == "__main__":
    main()
