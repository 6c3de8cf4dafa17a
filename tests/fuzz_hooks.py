"""schemathesis hooks for tests/test_api_fuzz.py, loaded through SCHEMATHESIS_HOOKS: a check that
a refused request (4xx) wrote nothing. Before each call the hook fingerprints every table of the
app (row count and newest row version, xmin, per table), and the check compares it after the
response. 429 is left out: a refusal over a ready-item limit is counted by design."""

import os

import psycopg
import schemathesis

COUNTED_REFUSALS = {429}
_connection = None
_before: dict[int, tuple] = {}


def _fingerprint() -> tuple:
    global _connection
    if _connection is None:
        _connection = psycopg.connect(os.environ["FUZZ_DATABASE_URL"], autocommit=True)
    tables = [row[0] for row in _connection.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
        "AND (tablename LIKE 'queues\\_%' OR tablename LIKE 'django\\_q\\_%') ORDER BY 1")]
    sql = " UNION ALL ".join(
        f"SELECT '{table}', count(*), max(xmin::text::bigint) FROM \"{table}\""
        for table in tables)
    return tuple(_connection.execute(sql).fetchall())


@schemathesis.hook
def before_call(ctx, case, **kwargs):
    _before[id(case)] = _fingerprint()


@schemathesis.check
def refused_request_writes_nothing(ctx, response, case):
    before = _before.pop(id(case), None)
    if before is None or not 400 <= response.status_code < 500:
        return None
    if response.status_code in COUNTED_REFUSALS:
        return None
    after = _fingerprint()
    changed = [b[0] for b, a in zip(before, after, strict=True) if a != b]
    if changed:
        raise AssertionError(f"a refused request wrote to the database: "
                             f"{response.status_code} answered, but {', '.join(changed)} changed")
    return None
