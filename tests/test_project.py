from io import StringIO

import pytest
from django.core.management import call_command


@pytest.mark.django_db
def test_models_and_migrations_agree():
    out = StringIO()
    call_command("makemigrations", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()


@pytest.mark.django_db
def test_the_database_cache_table_exists_after_migrate():
    from django.core.cache import cache

    cache.set("probe", 42)
    assert cache.get("probe") == 42
