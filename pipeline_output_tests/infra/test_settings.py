"""Settings: resolution, validation (one error naming the setting), URL helpers, real connections."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from pipeline_output.errors import PostgresUnavailable, SettingsError
from pipeline_output.infra.settings import (
    Settings,
    get_settings,
    has_password,
    mask_url,
    to_sqlalchemy_url,
    with_database,
)
from pipeline_output.services.runtime import settings_catalog


@pytest.fixture
def clean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No pyiceberg config anywhere (env, ~, cwd); cwd is tmp_path."""
    import os

    for var in list(os.environ):
        if var.upper().startswith("PYICEBERG_") or var.startswith("PIPELINE_OUTPUT_"):
            monkeypatch.delenv(var)
    user_home = tmp_path / "user"
    user_home.mkdir()
    monkeypatch.setenv("HOME", str(user_home))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_defaults_resolve_without_io(clean: Path) -> None:
    settings = get_settings({})
    assert settings == Settings(
        home=clean / ".pipeline_output",
        pg_url=None,
        catalog_name="default",
        namespace="datasets",
        catalog_config=None,
    )
    assert not settings.home.exists()  # resolving creates nothing


def test_environment_is_read_at_call_time(clean: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPELINE_OUTPUT_HOME", "rel/home")
    monkeypatch.setenv("PIPELINE_OUTPUT_NAMESPACE", "analytics")
    settings = get_settings()
    assert settings.home == clean / "rel" / "home"
    assert settings.home.is_absolute()
    assert settings.namespace == "analytics"


@pytest.mark.parametrize(
    ("env", "setting"),
    [
        ({"PIPELINE_OUTPUT_CATALOG": "my_cat"}, "PIPELINE_OUTPUT_CATALOG"),
        ({"PIPELINE_OUTPUT_NAMESPACE": "bad name"}, "PIPELINE_OUTPUT_NAMESPACE"),
        ({"PIPELINE_OUTPUT_PG_URL": "postgresql+psycopg2://u@h/db"}, "PIPELINE_OUTPUT_PG_URL"),
        ({"PIPELINE_OUTPUT_PG_URL": "postgresql://u@h/db?nonsense=1"}, "PIPELINE_OUTPUT_PG_URL"),
        ({"PYICEBERG_CATALOG__DEFAULT__URI": "foo://x"}, "PYICEBERG_CATALOG__DEFAULT__URI"),
        ({"PYICEBERG_CATALOG__DEFAULT__TYPE": "nosuch"}, "PYICEBERG_CATALOG__DEFAULT__TYPE"),
        ({"PYICEBERG_CATALOG__DEFAULT__TYPE": "rest"}, "PYICEBERG_CATALOG__DEFAULT__URI"),
        ({"PYICEBERG_CATALOG__DEFAULT__WAREHOUSE": "s3://b"}, "PYICEBERG_CATALOG__DEFAULT__URI"),
        (
            {"PYICEBERG_CATALOG__DEFAULT__URI": "postgresql+psycopg://::nope"},
            "PYICEBERG_CATALOG__DEFAULT__URI",
        ),
    ],
)
def test_bad_values_name_the_setting(clean: Path, env: dict[str, str], setting: str) -> None:
    with pytest.raises(SettingsError) as info:
        get_settings(env).check_catalog()
    assert info.value.setting == setting
    assert "\n" not in str(info.value)


def test_a_malformed_catalog_config_is_raised_only_where_the_environments_catalog_is_used(
    clean: Path,
) -> None:
    settings = get_settings({"PYICEBERG_CATALOG__DEFAULT__PY_IO_IMPL": "other.Io"})  # no uri
    assert settings.catalog_config is None
    for use in (settings.check_catalog, settings.catalog_properties):
        with pytest.raises(SettingsError) as info:
            use()
        assert info.value.setting == "PYICEBERG_CATALOG__DEFAULT__URI"
    assert not settings.home.exists()  # nothing was started to find out


def test_catalog_config_matches_pyiceberg_config(
    clean: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyiceberg.utils.config import Config

    monkeypatch.setenv("PYICEBERG_CATALOG__PROD__URI", "https://rest.example/api")
    monkeypatch.setenv("PYICEBERG_CATALOG__PROD__S3__ENDPOINT", "http://minio:9000")
    monkeypatch.setenv("PYICEBERG_CATALOG__OTHER__URI", "https://elsewhere")
    monkeypatch.setenv("PIPELINE_OUTPUT_CATALOG", "prod")
    settings = get_settings()
    assert settings.catalog_config == Config().get_catalog_config("prod")
    assert settings.catalog_config == {
        "uri": "https://rest.example/api",
        "s3.endpoint": "http://minio:9000",
    }


def test_catalog_config_from_yaml_with_env_on_top(
    clean: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf_dir = clean / "conf"
    conf_dir.mkdir()
    (conf_dir / ".pyiceberg.yaml").write_text(
        "catalog:\n  default:\n    uri: https://yaml.example\n    warehouse: s3://w\n"
    )
    env = {
        "PYICEBERG_HOME": str(conf_dir),
        "PYICEBERG_CATALOG__DEFAULT__URI": "https://env.example",
    }
    settings = get_settings(env)
    assert settings.catalog_config == {"uri": "https://env.example", "warehouse": "s3://w"}


def test_malformed_yaml_names_the_file(clean: Path) -> None:
    conf_dir = clean / "conf"
    conf_dir.mkdir()
    (conf_dir / ".pyiceberg.yaml").write_text("catalog:\n  default:\n    type: nosuch\n")
    with pytest.raises(SettingsError) as info:
        get_settings({"PYICEBERG_HOME": str(conf_dir)}).check_catalog()
    assert ".pyiceberg.yaml" in info.value.setting
    assert "nosuch" in info.value.cause


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("postgresql://u:secret@h:5432/db", "postgresql://u:***@h:5432/db"),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
        ("postgresql://u:@/db?host=/tmp/s", "postgresql://u:@/db?host=/tmp/s"),
        ("postgresql://h/db?user=u&password=pw", "postgresql://h/db?user=u&password=***"),
        ("postgresql+psycopg2://a:b%40c@h/db", "postgresql+psycopg2://a:***@h/db"),
    ],
)
def test_mask_url(url: str, masked: str) -> None:
    assert mask_url(url) == masked
    assert has_password(url) == (masked != url)


def test_url_conversions() -> None:
    url = "postgresql://postgres@/pipeline_output?host=/tmp/x"
    assert to_sqlalchemy_url(url, driver="psycopg2") == (
        "postgresql+psycopg2://postgres@/pipeline_output?host=/tmp/x"
    )
    assert to_sqlalchemy_url("postgres://u@h/d", driver="psycopg") == "postgresql+psycopg://u@h/d"
    assert with_database(url, database="other") == "postgresql://postgres@/other?host=/tmp/x"
    with pytest.raises(SettingsError):
        to_sqlalchemy_url("mysql://u@h/d", driver="psycopg")


def test_unreachable_pg_url_is_one_masked_retryable_error(clean: Path) -> None:
    settings = get_settings({"PIPELINE_OUTPUT_PG_URL": "postgresql://u:hunter2@127.0.0.1:1/db"})
    with pytest.raises(PostgresUnavailable) as info:  # a server that is down: retry
        settings.control_plane_url()
    message = str(info.value)
    assert message.startswith("PIPELINE_OUTPUT_PG_URL: cannot connect to postgresql://u:***@")
    assert "hunter2" not in message
    assert "\n" not in message
    assert not (clean / ".pipeline_output").exists()


def test_settings_env_uses_the_test_database(settings_env: Settings, pg_db_url: str) -> None:
    assert settings_env.control_plane_url() == pg_db_url
    assert settings_env.sqlalchemy_url("psycopg2").startswith("postgresql+psycopg2://")
    catalog = settings_catalog(settings_env)
    assert ("datasets",) in catalog.list_namespaces()
    assert catalog.properties["warehouse"] == f"file://{settings_env.home}/warehouse"
    # the catalog tables live in the control-plane database
    with psycopg.connect(pg_db_url) as conn:
        row = conn.execute("SELECT count(*) FROM iceberg_namespace_properties").fetchone()
    assert row is not None and row[0] >= 1
    settings_catalog(settings_env)  # idempotent: the namespace already exists


def test_catalog_from_pyiceberg_env_config(
    settings_env: Settings, pg_db_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PIPELINE_OUTPUT_NAMESPACE", "sales")
    monkeypatch.setenv(
        "PYICEBERG_CATALOG__DEFAULT__URI", to_sqlalchemy_url(pg_db_url, driver="psycopg")
    )
    monkeypatch.setenv("PYICEBERG_CATALOG__DEFAULT__WAREHOUSE", f"file://{tmp_path}/wh2")
    settings = get_settings()
    assert settings.catalog_config is not None
    catalog = settings_catalog(settings)
    assert type(catalog).__name__ == "SqlCatalog"
    assert ("sales",) in catalog.list_namespaces()


def test_concurrent_first_catalog_calls_do_not_race(settings_env: Settings) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=4) as pool:
        catalogs = list(pool.map(lambda _: settings_catalog(settings_env), range(4)))
    assert all(("datasets",) in c.list_namespaces() for c in catalogs)
