"""Settings: the only module that reads the environment, and only when asked (never at import).

`get_settings()` resolves and validates every setting without I/O beyond reading pyiceberg's
config file; a bad value raises `SettingsError` naming the variable. A malformed pyiceberg catalog
config is kept instead (`Settings.catalog_error`) and raised only where the environment's catalog
is used (`Settings.check_catalog`, `catalog_properties`): a code location whose
`PipelineOutputResource` names its own catalog never reads it. The `Settings` methods then
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

Below the settings, in this order: the Postgres URL helpers and pyiceberg's catalog config
parsing (both handed the values: only `get_settings` and the `*(environ)` functions read the
environment). Postgres URL helpers: masking passwords, libpq URI to SQLAlchemy URL, another database, and
the project error for a failed connection to a URL (`connect_failure`).

Pure functions (no environment, no I/O); `settings` re-exports the URL helpers.

pyiceberg catalog configuration, resolved and validated before anything connects.

Owns reading the catalog's config the way `pyiceberg.utils.config.Config()` does (the first
`.pyiceberg.yaml` in `$PYICEBERG_HOME`, `~`, the working directory; `PYICEBERG_CATALOG__<NAME>__`
variables on top) but from the environment mapping `settings` passes in — this module never reads
`os.environ` itself — and refusing a malformed config with an error naming the setting; then
its catalog properties (`sql_catalog_properties` for the default SQL catalog) for the store's
`open_catalog` (stores/iceberg/table/catalog.py), for `settings` and `services.runtime.connect`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from pipeline_output.errors import (
    PipelineOutputError,
    PostgresUnavailable,
    SettingsError,
    connection_refused,
    driver_message,
)

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
    catalog_error: SettingsError | None = field(default=None, compare=False)
    """Why pyiceberg's config of `catalog_name` is unusable (then `catalog_config` is None)."""

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

    def check_catalog(self) -> None:
        """Raise the `SettingsError` of a malformed pyiceberg catalog config (naming the setting):
        callers about to use the environment's catalog call it before starting anything."""
        if self.catalog_error is not None:
            raise SettingsError(self.catalog_error.setting, self.catalog_error.cause)

    def catalog_properties(self) -> dict[str, str]:
        """The Iceberg catalog's properties: pyiceberg's own config when there is one, else its SQL
        catalog on the control plane with the warehouse under the home (opened by the store's
        `open_catalog`). A malformed config raises its `SettingsError` (`check_catalog`)."""
        self.check_catalog()
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

    return Settings(home, pg_url, catalog_name, namespace, *_catalog_config(env, catalog_name))


def _catalog_config(
    env: Mapping[str, str], catalog_name: str
) -> tuple[Mapping[str, str] | None, SettingsError | None]:
    """pyiceberg's config of `catalog_name` in `env`, or why it is unusable: the error is raised
    where the environment's catalog is used (`Settings.check_catalog`), not here."""
    try:
        return read_catalog_config(env, catalog_name), None
    except SettingsError as exc:
        return None, exc


# --- internals -------------------------------------------------------------------------------


def check_control_plane(url: str, *, setting: str) -> None:
    """Connect to the Postgres at `url` once: `SettingsError` naming `setting` when the server
    refuses the URL (or it is malformed), `PostgresUnavailable` when it is down (retryable).
    The session is this process's pooled one (`pgsession.pooled`: the control plane's ledger
    and locks then open no new connection; an idle one is checked with an empty query)."""
    import psycopg

    from pipeline_output.infra import pgsession

    try:
        with pgsession.pooled(url, connect_timeout=5):
            pass
    except psycopg.OperationalError as exc:
        raise connect_failure(exc, setting=setting, url=url) from exc
    except psycopg.Error as exc:
        raise SettingsError(setting, f"cannot connect to {mask_url(url)}: {one_line(exc)}") from exc


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


def mask_url(url: str) -> str:
    """`url` with its password (in the userinfo or a `password=` parameter) replaced by ***."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "***"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, hostinfo = netloc.rsplit("@", 1)
        if ":" in userinfo:
            user, password = userinfo.split(":", 1)
            if password:
                userinfo = f"{user}:***"
        netloc = f"{userinfo}@{hostinfo}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(key == "password" for key, _ in pairs):
            masked = [(k, "***" if k == "password" else v) for k, v in pairs]
            query = urlencode(masked, safe="/*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def has_password(url: str) -> bool:
    """True if `url` carries a password (so it must not be printed as is)."""
    return mask_url(url) != url


def to_sqlalchemy_url(url: str, *, driver: str) -> str:
    """Turn a libpq URI (`postgresql://` or `postgres://`) into `postgresql+<driver>://`."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("postgresql", "postgres"):
        raise SettingsError(PG_URL, f"not a libpq URI (postgresql://...): {mask_url(url)}")
    return f"postgresql+{driver}://{rest}"


def with_database(url: str, *, database: str) -> str:
    """The libpq URI `url` pointing at another database on the same server."""
    parts = urlsplit(url)
    return urlunsplit(
        (parts.scheme, parts.netloc, "/" + quote(database), parts.query, parts.fragment)
    )


def check_libpq_url(url: str, *, setting: str = PG_URL) -> str:
    """`url` if it is a well-formed libpq URI (`postgresql://`), else `SettingsError` naming
    `setting` (the password masked). Parses only: no connection."""
    import psycopg.conninfo

    scheme = url.partition("://")[0] if isinstance(url, str) else ""
    if scheme not in ("postgresql", "postgres"):
        shown = mask_url(url) if isinstance(url, str) else type(url).__name__
        raise SettingsError(
            setting,
            f"expected a libpq URI postgresql://user:password@host:port/dbname, got {shown}",
        )
    try:
        psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        raise SettingsError(setting, f"malformed URI {mask_url(url)}: {one_line(exc)}") from exc
    return url


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (its class name when it has none)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def connect_failure(exc: BaseException, *, setting: str, url: str) -> PipelineOutputError:
    """The error for a failed connection to `url` (from `setting`): `SettingsError` naming the
    setting when the server refused the URL (no such database or role, authentication failed:
    change the setting), else `PostgresUnavailable` (down, starting, dropped: retry). One line,
    the password masked, the driver's message without SQLAlchemy's link."""
    cause = f"cannot connect to {mask_url(url)}: {driver_message(exc)}"
    if connection_refused(exc):
        return SettingsError(setting, cause)
    return PostgresUnavailable(f"{setting}: {cause}")


_CATALOG_TYPES = ("rest", "hive", "glue", "dynamodb", "sql", "in-memory", "bigquery")
_PYICEBERG_YAML = ".pyiceberg.yaml"
_NAMESPACE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def catalog_env_prefix(catalog_name: str) -> str:
    """`PYICEBERG_CATALOG__<NAME>__`, the env prefix pyiceberg maps to `catalog_name`."""
    return f"PYICEBERG_CATALOG__{catalog_name.upper().replace('-', '_')}__"


def env_name(catalog_name: str, key: str) -> str:
    return catalog_env_prefix(catalog_name) + key.upper().replace(".", "__").replace("-", "_")


def read_catalog_config(env: Mapping[str, str], catalog_name: str) -> Mapping[str, str] | None:
    """pyiceberg's config for `catalog_name`, resolved like `pyiceberg.utils.config.Config()`.

    Same sources and precedence (first `.pyiceberg.yaml` in $PYICEBERG_HOME, ~, cwd; then
    `PYICEBERG_CATALOG__<NAME>__<KEY>` variables on top), but read from `env` so that tests and
    callers can pass an explicit environment, and each key remembers where it came from so that an
    error names the setting. Validated here, before anything is started (`get_settings` keeps the
    error for `Settings.check_catalog`).
    """
    config: dict[str, str] = {}
    origin: dict[str, str] = {}
    yaml_path, yaml_catalog = _yaml_catalog(env, catalog_name)
    for key, value in yaml_catalog.items():
        config[key] = value
        origin[key] = f"{yaml_path} (catalog.{catalog_name}.{key})"
    prefix = "pyiceberg_catalog__"
    for var, value in env.items():
        lower = var.lower()
        if not lower.startswith(prefix):
            continue
        parts = lower[len("pyiceberg_") :].split("__", maxsplit=2)
        if len(parts) != 3:
            continue
        name, key = parts[1].replace("_", "-"), parts[2].replace("__", ".").replace("_", "-")
        if name == catalog_name and value:
            config[key] = value
            origin[key] = var
    if not config:
        return None
    validate_catalog_properties(
        catalog_name, config, where=lambda key: origin.get(key, env_name(catalog_name, key))
    )
    return config


def _yaml_catalog(env: Mapping[str, str], catalog_name: str) -> tuple[str, dict[str, str]]:
    import strictyaml

    for directory in (env.get("PYICEBERG_HOME"), os.path.expanduser("~"), os.getcwd()):
        if not directory:
            continue
        path = Path(directory) / _PYICEBERG_YAML
        if not path.is_file():
            continue
        try:
            data = strictyaml.load(path.read_text(encoding="utf-8")).data
        except (strictyaml.YAMLError, OSError, UnicodeDecodeError) as exc:
            raise SettingsError(str(path), f"cannot parse: {one_line(exc)}") from exc
        if not isinstance(data, dict):
            raise SettingsError(str(path), "expected a mapping at the top level")
        catalogs = {str(k).lower(): v for k, v in data.items()}.get("catalog")
        if catalogs is None:
            return str(path), {}
        if not isinstance(catalogs, dict):
            raise SettingsError(str(path), "'catalog' must be a mapping of catalog names")
        entry = {str(k).lower(): v for k, v in catalogs.items()}.get(catalog_name)
        if entry is None:
            return str(path), {}
        if not isinstance(entry, dict):
            raise SettingsError(str(path), f"catalog.{catalog_name} must be a mapping")
        flat: dict[str, str] = {}
        for key, value in entry.items():
            if not isinstance(value, str):
                raise SettingsError(
                    str(path), f"catalog.{catalog_name}.{key} must be a string value"
                )
            flat[str(key).lower()] = value
        return str(path), flat  # pyiceberg uses only the first file it finds
    return "", {}


def validate_catalog_properties(
    name: str, config: Mapping[str, str], *, where: Callable[[str], str]
) -> None:
    """Refuse a malformed catalog config before anything connects (`SettingsError` naming
    `where(key)`, the setting a key came from)."""
    catalog_type = config.get("type")
    impl = config.get("py-catalog-impl")
    uri = config.get("uri")
    if impl is not None:
        if catalog_type is not None:
            raise SettingsError(where("type"), "set either type or py-catalog-impl, not both")
        if "." not in impl:
            raise SettingsError(where("py-catalog-impl"), f"{impl!r} is not a module.Class path")
        return
    if catalog_type is not None:
        if catalog_type.lower() not in _CATALOG_TYPES:
            raise SettingsError(
                where("type"),
                f"unknown catalog type {catalog_type!r} (one of {', '.join(_CATALOG_TYPES)})",
            )
        catalog_type = catalog_type.lower()
        if catalog_type in ("rest", "hive", "sql") and not uri:
            raise SettingsError(where("uri"), f"a {catalog_type} catalog needs a uri")
    elif not uri:
        raise SettingsError(
            where("uri"), f"catalog {name!r} is configured but has neither a type nor a uri"
        )
    elif uri.startswith("http"):
        catalog_type = "rest"
    elif uri.startswith("thrift"):
        catalog_type = "hive"
    elif uri.startswith(("sqlite", "postgresql")):
        catalog_type = "sql"
    else:
        raise SettingsError(
            where("uri"), f"cannot infer the catalog type from uri {mask_url(uri)}; set type too"
        )
    if catalog_type == "sql" and uri:
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        try:
            make_url(uri)
        except (ArgumentError, ValueError) as exc:
            raise SettingsError(where("uri"), f"not a SQLAlchemy URL: {mask_url(uri)}") from exc
    if catalog_type == "rest" and uri and not re.match(r"^https?://[^/\s]+", uri):
        raise SettingsError(where("uri"), f"not an http(s) URL: {mask_url(uri)}")


def check_namespace(namespace: object, *, setting: str) -> str:
    """`namespace` if it is a valid Iceberg namespace (dotted identifiers), else `SettingsError`."""
    if not isinstance(namespace, str) or not _NAMESPACE.match(namespace):
        raise SettingsError(
            setting, f"{namespace!r} is not a valid namespace (letters, digits, _ and .)"
        )
    return namespace
