"""Migration 0032: the database's sessions compile no query to machine code (PostgreSQL)."""

import importlib
import uuid
from types import SimpleNamespace

import psycopg
import pytest
from django.db import connection

from tests.migrating import migrated_back_to

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]


def database_settings() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT setconfig FROM pg_db_role_setting s JOIN pg_database d "
                       "ON d.oid = s.setdatabase WHERE d.datname = current_database() "
                       "AND s.setrole = 0")
        row = cursor.fetchone()
    return row[0] if row else []


def jit_of_a_new_session() -> str:
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    with psycopg.connect(**params) as session:
        return session.execute("SHOW jit").fetchone()[0]


def test_a_new_session_of_the_database_runs_without_jit():
    assert "jit=off" in database_settings()
    assert jit_of_a_new_session() == "off"


@pytest.mark.django_db(transaction=True)
def test_migrating_back_gives_the_database_the_servers_jit_and_forth_turns_it_off():
    with migrated_back_to("0031_item_payload_at_rest_gin"):
        assert "jit=off" not in database_settings()
    assert "jit=off" in database_settings()


def test_a_role_that_does_not_own_the_database_migrates_without_turning_jit_off(capsys):
    # ALTER DATABASE would refuse it; the migration goes on and says what to run by hand.
    migration = importlib.import_module("queues.migrations.0032_database_jit_off")
    role = f"qa_not_owner_{uuid.uuid4().hex[:8]}"
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE ROLE {role}")
        cursor.execute(f"SET LOCAL ROLE {role}")
        migration.jit_default(None, SimpleNamespace(connection=connection))
        cursor.execute("RESET ROLE")
    assert "only the database's owner may turn it off" in capsys.readouterr().out
    assert "jit=off" in database_settings()
