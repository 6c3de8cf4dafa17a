"""Migration operations of our own (the loader skips modules whose name starts with _)."""

import time

from django.db import NotSupportedError, OperationalError, transaction
from django.db.migrations import AddConstraint, AddIndex, RemoveIndex
from django.db.migrations.operations.base import Operation


def _change_index_concurrently(operation, app_label, schema_editor, state, index, *,
                               create: bool):
    """CREATE or DROP INDEX CONCURRENTLY on PostgreSQL; nothing elsewhere.

    Repeatable: a build interrupted with its migration (a deploy stopped while it waited for
    old transactions) can leave the index built, or left invalid, without the migration
    recorded; and docs/deploy.md lets an operator build a big index ahead of the deploy. So a
    valid index of the name is kept, an invalid one dropped and built again, and a drop of an
    index that is gone does nothing."""
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    if connection.in_atomic_block:
        raise NotSupportedError("set atomic = False on the migration")
    model = state.apps.get_model(app_label, operation.model_name)
    if not operation.allow_migrate_model(connection.alias, model):
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT i.indisvalid FROM pg_class c JOIN pg_index i ON i.indexrelid = "
                       "c.oid WHERE c.relname = %s AND c.relnamespace = "
                       "current_schema()::regnamespace", [index.name])
        row = cursor.fetchone()
    if create:
        if row and row[0]:
            return
        if row:
            schema_editor.remove_index(model, index, concurrently=True)
        schema_editor.add_index(model, index, concurrently=True)
    elif row:
        schema_editor.remove_index(model, index, concurrently=True)


class AddIndexConcurrentlyOnPostgres(AddIndex):
    """An index PostgreSQL builds without blocking writes to a table of millions of rows, and
    other databases skip (their query falls back to reading the value). Django's own
    AddIndexConcurrently imports psycopg, which a host project on SQLite may not have."""

    atomic = False

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        _change_index_concurrently(self, app_label, schema_editor, to_state, self.index,
                                   create=True)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        _change_index_concurrently(self, app_label, schema_editor, from_state, self.index,
                                   create=False)


class _PlainElsewhere:
    """Mixed in before an ...OnPostgres operation: that one on PostgreSQL, and `plain`,
    Django's own operation, elsewhere (SQLite's tables are small enough to lock)."""

    plain: type

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            super().database_forwards(app_label, schema_editor, from_state, to_state)
        else:
            self.plain.database_forwards(self, app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            super().database_backwards(app_label, schema_editor, from_state, to_state)
        else:
            self.plain.database_backwards(self, app_label, schema_editor, from_state, to_state)


class AddIndexConcurrently(_PlainElsewhere, AddIndexConcurrentlyOnPostgres):
    """Built concurrently on PostgreSQL, as above, and the plain way elsewhere."""

    plain = AddIndex


class RemoveIndexConcurrentlyOnPostgres(RemoveIndex):
    """The reverse of AddIndexConcurrentlyOnPostgres: DROP INDEX CONCURRENTLY waits for the
    queries using the index instead of locking writers out of the table."""

    atomic = False

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        _change_index_concurrently(self, app_label, schema_editor, from_state,
                                   self._index(app_label, from_state), create=False)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        _change_index_concurrently(self, app_label, schema_editor, to_state,
                                   self._index(app_label, to_state), create=True)

    def _index(self, app_label, state):
        return state.models[app_label, self.model_name_lower].get_index_by_name(self.name)


class RemoveIndexConcurrently(_PlainElsewhere, RemoveIndexConcurrentlyOnPostgres):
    """Dropped concurrently on PostgreSQL, as above, and the plain way elsewhere: the reverse
    of AddIndexConcurrently."""

    plain = RemoveIndex


class AddCheckConstraintValidatedOnPostgres(AddConstraint):
    """On PostgreSQL, add the CHECK as NOT VALID (a brief lock, no scan) and validate it in a
    second statement that lets writes go on; elsewhere, Django's own way."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor != "postgresql":
            return super().database_forwards(app_label, schema_editor, from_state, to_state)
        model = to_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        table = schema_editor.quote_name(model._meta.db_table)
        name = schema_editor.quote_name(self.constraint.name)
        check = self.constraint._get_check_sql(model, schema_editor)
        schema_editor.execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} CHECK ({check}) "
                              "NOT VALID")
        schema_editor.execute(f"ALTER TABLE {table} VALIDATE CONSTRAINT {name}")


class StorageOnPostgres(Operation):
    """Storage parameters set going forwards and reset going back, on PostgreSQL only (other
    databases have none); subclasses say what they alter."""

    reversible = True

    def state_forwards(self, app_label, state):
        pass

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        settings = ", ".join(f"{name} = {value}" for name, value in self.parameters.items())
        self._alter(app_label, schema_editor, to_state, f"SET ({settings})")

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        self._alter(app_label, schema_editor, from_state,
                    f"RESET ({', '.join(self.parameters)})")


class SetStorageOnPostgres(StorageOnPostgres):
    """Storage parameters of one table (autovacuum's triggers, say). ALTER TABLE ... SET takes
    a lock that lets reads and writes go on and rewrites nothing, so it is safe on a table of
    millions of rows."""

    def __init__(self, model_name: str, parameters: dict):
        self.model_name, self.parameters = model_name, parameters

    def _alter(self, app_label, schema_editor, state, clause: str):
        if schema_editor.connection.vendor != "postgresql":
            return
        model = state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            table = schema_editor.quote_name(model._meta.db_table)
            schema_editor.execute(f"ALTER TABLE {table} {clause}")

    def describe(self):
        return f"Set storage parameters of {self.model_name} on PostgreSQL"


class SetIndexStorageOnPostgres(StorageOnPostgres):
    """Storage parameters of one index. The change is to the catalogue alone, but it takes the
    index's ACCESS EXCLUSIVE lock, which every writer to the table needs too: waiting for it
    behind a long transaction would hold all of them up, so each try gives up after a moment
    and the next one starts a second later."""

    attempts = 10
    lock_timeout = "2s"
    pause = 1.0

    def __init__(self, index_name: str, parameters: dict):
        self.index_name, self.parameters = index_name, parameters

    def _alter(self, app_label, schema_editor, state, clause: str):
        connection = schema_editor.connection
        if connection.vendor != "postgresql":
            return
        name = schema_editor.quote_name(self.index_name)
        for attempt in range(self.attempts):
            try:
                with transaction.atomic(using=connection.alias):
                    schema_editor.execute(f"SET LOCAL lock_timeout = '{self.lock_timeout}'")
                    schema_editor.execute(f"ALTER INDEX {name} {clause}")
                return
            except OperationalError:
                if attempt == self.attempts - 1:
                    raise
                time.sleep(self.pause)

    def describe(self):
        return f"Set storage parameters of index {self.index_name} on PostgreSQL"
