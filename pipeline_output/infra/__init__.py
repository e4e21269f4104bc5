"""Infrastructure: settings (the one reader of the environment), catalog configuration, Postgres
URLs and sessions, the embedded server, the Dagster home, and every lock."""
