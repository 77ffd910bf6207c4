"""A PostgreSQL backend whose connection attempts fail fast while the database is down."""
