"""Settings: the only module that reads the environment, and only when asked (never at import).

`get_settings()` resolves and validates every setting without I/O beyond reading pyiceberg's
config file; a bad value raises `SettingsError` naming the variable. The `Settings` methods then
do the I/O: `control_plane_url()` checks the external Postgres or starts/reuses the embedded one,
`catalog_properties()` describes the Iceberg catalog (the store opens it).

A Postgres that refuses the URL (no such database or role, authentication failed) is a
`SettingsError` naming the variable; one that is down is `PostgresUnavailable` (retryable).

Environment:

| variable | default | meaning |
|---|---|---|
| `PIPELINE_OUTPUT_HOME` | `./.pipeline_output` | local state: embedded Postgres, warehouse, DAGSTER_HOME |
| `PIPELINE_OUTPUT_PG_URL` | (embedded server) | control-plane Postgres, a libpq URI |
| `PIPELINE_OUTPUT_CATALOG` | `default` | pyiceberg catalog name (lowercase, no `_`) |
| `PIPELINE_OUTPUT_NAMESPACE` | `datasets` | Iceberg namespace of the datasets |
| `PYICEBERG_CATALOG__<NAME>__<KEY>`, `.pyiceberg.yaml` | | pyiceberg's own catalog config |
| `PIPELINE_OUTPUT_DEFAULT_MODE` | `pg` | mode of a dataset declared without `mode=` |
| `PIPELINE_OUTPUT_DUAL_READS_FROM` | `pg` | the arm downstream reads of a `dual` dataset use |
| `PIPELINE_OUTPUT_DEFINITIONS` | (pyproject, else the demo) | the CLI's code location |
| `PIPELINE_OUTPUT_FAULT` | | test-only fault injection point (`<point>` or `<point>:pause:<path>`) |

Catalog config parsing lives in `catalog_config` and URL helpers in `pg_urls` (both handed the
values, neither reads the environment); `settings` re-exports the URL helpers.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pipeline_output.errors import SettingsError
from pipeline_output.infra.catalog_config import (
    catalog_env_prefix,
    check_namespace,
    env_name,
    read_catalog_config,
)
from pipeline_output.infra.pg_urls import (
    check_libpq_url,
    connect_failure,
    has_password,
    mask_url,
    to_sqlalchemy_url,
    with_database,
)
from pipeline_output.infra.pg_urls import one_line as _one_line

HOME = "PIPELINE_OUTPUT_HOME"
PG_URL = "PIPELINE_OUTPUT_PG_URL"
CATALOG = "PIPELINE_OUTPUT_CATALOG"
NAMESPACE = "PIPELINE_OUTPUT_NAMESPACE"
DAGSTER_PG_URL = "PIPELINE_OUTPUT_DAGSTER_PG_URL"
"""Read by dagster.yaml: the control plane as a `postgresql+psycopg2://` SQLAlchemy URL."""

_CATALOG_NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


@dataclass(frozen=True)
class Settings:
    """Resolved, validated settings. Methods that touch Postgres or the catalog do I/O."""

    home: Path
    pg_url: str | None
    catalog_name: str
    namespace: str
    catalog_config: Mapping[str, str] | None

    @property
    def pg_data_dir(self) -> Path:
        """Data directory of the embedded Postgres server."""
        return self.home / "pg"

    @property
    def dagster_home(self) -> Path:
        """DAGSTER_HOME for this project (the CLI puts dagster.yaml there)."""
        return self.home / "dagster"

    @property
    def warehouse(self) -> str:
        """Warehouse location of the default SQL catalog."""
        return f"file://{self.home}/warehouse"

    def control_plane_url(self) -> str:
        """libpq URI of the control-plane Postgres: checked reachable, or the embedded server."""
        if self.pg_url is not None:
            check_control_plane(self.pg_url, setting=PG_URL)
            return self.pg_url
        from pipeline_output.infra import embedded_pg

        try:
            return embedded_pg.start(data_dir=self.pg_data_dir)
        except embedded_pg.EmbeddedPostgresError as exc:
            raise SettingsError(HOME, f"embedded Postgres: {exc}") from exc

    def sqlalchemy_url(self, driver: str = "psycopg") -> str:
        """The control plane as a SQLAlchemy URL (`postgresql+<driver>://`)."""
        return to_sqlalchemy_url(self.control_plane_url(), driver=driver)

    def catalog_properties(self) -> dict[str, str]:
        """The Iceberg catalog's properties: pyiceberg's own config when there is one, else its SQL
        catalog on the control plane with the warehouse under the home (opened by the store's
        `open_catalog`)."""
        if self.catalog_config is not None:
            return dict(self.catalog_config)
        from pipeline_output.infra.pgsession import session_conninfo

        uri = to_sqlalchemy_url(session_conninfo(self.control_plane_url()), driver="psycopg")
        return {"type": "sql", "uri": uri, "warehouse": self.warehouse}

    def catalog_setting(self, key: str) -> str:
        """The environment variable a catalog property `key` comes from (errors name it)."""
        return env_name(self.catalog_name, key)


def get_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Resolve and validate the settings from `environ` (default: the process environment)."""
    env: Mapping[str, str] = os.environ if environ is None else environ

    raw_home = env.get(HOME) or "./.pipeline_output"
    home = Path(os.path.abspath(os.path.expanduser(raw_home)))
    if home.exists() and not home.is_dir():
        raise SettingsError(HOME, f"{home} exists and is not a directory")

    pg_url = env.get(PG_URL) or None
    if pg_url is not None:
        check_libpq_url(pg_url, setting=PG_URL)

    catalog_name = env.get(CATALOG) or "default"
    if not _CATALOG_NAME.match(catalog_name):
        raise SettingsError(
            CATALOG,
            f"{catalog_name!r} is not a usable catalog name: use lowercase letters, digits and '-' "
            "(pyiceberg turns '_' in PYICEBERG_CATALOG__<NAME>__ variables into '-')",
        )

    namespace = check_namespace(env.get(NAMESPACE) or "datasets", setting=NAMESPACE)

    catalog_config = read_catalog_config(env, catalog_name)
    return Settings(
        home=home,
        pg_url=pg_url,
        catalog_name=catalog_name,
        namespace=namespace,
        catalog_config=catalog_config,
    )


# --- internals -------------------------------------------------------------------------------


def check_control_plane(url: str, *, setting: str) -> None:
    """Connect to the Postgres at `url` once: `SettingsError` naming `setting` when the server
    refuses the URL (or it is malformed), `PostgresUnavailable` when it is down (retryable)."""
    import psycopg

    from pipeline_output.infra import pgsession

    try:
        with pgsession.connect(url, connect_timeout=5):
            pass
    except psycopg.OperationalError as exc:
        raise connect_failure(exc, setting=setting, url=url) from exc
    except psycopg.Error as exc:
        raise SettingsError(
            setting, f"cannot connect to {mask_url(url)}: {_one_line(exc)}"
        ) from exc


FAULT_POINTS = ("before_commit", "in_commit", "after_commit")
_PAUSE = ":pause:"


def fault_point(environ: Mapping[str, str] | None = None) -> str | None:
    """`PIPELINE_OUTPUT_FAULT`: a test-only fault-injection point.

    `before_commit`: after the write's data files are written, before its manifests and the
    Iceberg commit; `in_commit`: its manifests written too, right before the commit's last checks
    and the catalog swap; `after_commit`: after the commit, before the ledger records it. The
    process SIGKILLs itself there, or with `<point>:pause:<path>` pauses there instead
    (`fault_pause`). Unset in normal use.
    """
    env = os.environ if environ is None else environ
    value = env.get("PIPELINE_OUTPUT_FAULT") or None
    point = value.split(_PAUSE, 1)[0] if value is not None else None
    if point is not None and point not in FAULT_POINTS:
        raise SettingsError(
            "PIPELINE_OUTPUT_FAULT",
            f"unknown fault point {point!r}; valid: {', '.join(FAULT_POINTS)} "
            "(optionally followed by :pause:<path>)",
        )
    return point


def fault_pause(environ: Mapping[str, str] | None = None) -> str | None:
    """The `<path>` of `PIPELINE_OUTPUT_FAULT=<point>:pause:<path>`: at the point the process
    creates `<path>.paused` and waits until `<path>` exists, then goes on (None: it SIGKILLs)."""
    env = os.environ if environ is None else environ
    value = env.get("PIPELINE_OUTPUT_FAULT") or ""
    return value.split(_PAUSE, 1)[1] if _PAUSE in value else None


def default_mode(environ: Mapping[str, str] | None = None) -> str:
    """`PIPELINE_OUTPUT_DEFAULT_MODE`: the project default mode (`pg`: the legacy arm until flipped)."""
    env = os.environ if environ is None else environ
    value = env.get("PIPELINE_OUTPUT_DEFAULT_MODE") or "pg"
    if value not in ("pg", "iceberg", "dual"):
        raise SettingsError(
            "PIPELINE_OUTPUT_DEFAULT_MODE", f"unknown mode {value!r}; valid: pg, iceberg, dual"
        )
    return value


def dual_read_arm(environ: Mapping[str, str] | None = None) -> str:
    """`PIPELINE_OUTPUT_DUAL_READS_FROM`: the arm downstream reads use in `dual` (default `pg`)."""
    env = os.environ if environ is None else environ
    value = env.get("PIPELINE_OUTPUT_DUAL_READS_FROM") or "pg"
    if value not in ("pg", "iceberg"):
        raise SettingsError(
            "PIPELINE_OUTPUT_DUAL_READS_FROM", f"unknown arm {value!r}; valid: pg, iceberg"
        )
    return value


def variable(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The value of the environment variable `name` now (e.g. one a resource's `dg.EnvVar`
    names), read here like every other variable."""
    env = os.environ if environ is None else environ
    return env.get(name)


DEFINITIONS = "PIPELINE_OUTPUT_DEFINITIONS"
_TARGET = re.compile(r"^[A-Za-z_][\w.]*(:[A-Za-z_]\w*)?$")


def definitions_target(environ: Mapping[str, str] | None = None) -> str | None:
    """`PIPELINE_OUTPUT_DEFINITIONS`: the code location CLI commands serve, `module[:attribute]`
    (unset: the nearest pyproject's `[tool.dagster]`/`[tool.dg]`, else the demo)."""
    env = os.environ if environ is None else environ
    value = (env.get(DEFINITIONS) or "").strip() or None
    if value is not None and not _TARGET.match(value):
        raise SettingsError(
            DEFINITIONS,
            f"{value!r} is not `module` or `module:attribute` (e.g. my_project.defs:defs)",
        )
    return value


__all__ = [
    "Settings",
    "catalog_env_prefix",
    "check_control_plane",
    "default_mode",
    "definitions_target",
    "dual_read_arm",
    "fault_pause",
    "fault_point",
    "get_settings",
    "has_password",
    "mask_url",
    "to_sqlalchemy_url",
    "variable",
    "with_database",
]
