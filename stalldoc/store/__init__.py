"""The run directory's SQLite database."""
