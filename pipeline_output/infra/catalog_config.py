"""pyiceberg catalog configuration, resolved and validated before anything connects.

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
from pathlib import Path

from pipeline_output.errors import SettingsError
from pipeline_output.infra.pg_urls import mask_url, one_line

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
    error names the setting. Validated here, before anything is started.
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
