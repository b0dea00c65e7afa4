"""Alembic environment and versions. Run through ``gateway.db.session.Database.upgrade()`` or
``alembic -c migrations/alembic.ini upgrade head`` (URL from ``PAGEGATE_DATABASE_URL``)."""
