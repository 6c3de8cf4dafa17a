"""Migration operations of our own (the loader skips modules whose name starts with _)."""

from django.db import NotSupportedError
from django.db.migrations import AddIndex


class AddIndexConcurrentlyOnPostgres(AddIndex):
    """An index PostgreSQL builds without blocking writes to a table of millions of rows, and
    other databases skip (their query falls back to reading the value). Django's own
    AddIndexConcurrently imports psycopg, which a host project on SQLite may not have."""

    atomic = False

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor != "postgresql":
            return
        if schema_editor.connection.in_atomic_block:
            raise NotSupportedError("set atomic = False on the migration")
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            schema_editor.add_index(model, self.index, concurrently=True)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor != "postgresql":
            return
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            schema_editor.remove_index(model, self.index, concurrently=True)
