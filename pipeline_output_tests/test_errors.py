"""The error policy: every deliberate error lives in `errors.py` under a retryable or a terminal
base, the package raises no bare builtin on purpose, and the CLI prints one line for our errors and
for the dependency errors users meet (pyiceberg commit failures, Postgres connection errors)."""

from __future__ import annotations

import ast
import inspect
import socket
from pathlib import Path

import click
import psycopg
import pytest
from click.testing import CliRunner
from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException

from pipeline_output import cli, errors

PACKAGE = Path(errors.__file__).resolve().parent
BUILTINS_RAISED_ON_PURPOSE = {"ValueError", "LookupError", "KeyError", "RuntimeError", "TypeError"}


def _modules() -> list[tuple[Path, ast.Module]]:
    return [(p, ast.parse(p.read_text(), str(p))) for p in sorted(PACKAGE.rglob("*.py"))]


def _error_classes() -> list[type[errors.PipelineOutputError]]:
    return [
        obj
        for _, obj in inspect.getmembers(errors, inspect.isclass)
        if issubclass(obj, errors.PipelineOutputError) and obj.__module__ == errors.__name__
    ]


def test_every_exception_class_of_the_package_is_defined_in_errors_py() -> None:
    stray = []
    for path, tree in _modules():
        if path.name == "errors.py":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and any(
                (isinstance(b, ast.Name) and (b.id.endswith(("Error", "Exception"))))
                or (isinstance(b, ast.Attribute) and b.attr.endswith(("Error", "Exception")))
                for b in node.bases
            ):
                stray.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}")
    assert stray == []


def test_every_error_is_either_retryable_or_terminal_never_both() -> None:
    bases = {errors.PipelineOutputError, errors.RetryableError, errors.TerminalError}
    classes = [c for c in _error_classes() if c not in bases]
    assert len(classes) >= 20
    for cls in classes:
        kinds = [issubclass(cls, errors.RetryableError), issubclass(cls, errors.TerminalError)]
        assert kinds.count(True) == 1, cls
        assert cls.retryable is issubclass(cls, errors.RetryableError), cls
    assert errors.LockLost.retryable and errors.WriteConflict.retryable
    assert not errors.BadInput.retryable and not errors.InvalidSpec.retryable


def test_the_package_raises_no_bare_builtin_error_on_purpose() -> None:
    raised = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Raise) or node.exc is None:
                continue
            target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(target, ast.Name) and target.id in BUILTINS_RAISED_ON_PURPOSE:
                raised.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {target.id}")
    assert raised == []


def test_errors_that_replace_builtins_still_satisfy_callers_catching_the_builtin() -> None:
    assert issubclass(errors.DatasetNotWritten, LookupError)
    assert issubclass(errors.UnknownDataset, LookupError)
    assert issubclass(errors.InvalidArgument, ValueError)
    assert issubclass(errors.UnknownMode, ValueError)
    assert issubclass(errors.WriteAlreadyFinished, RuntimeError)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _real_connection_error() -> psycopg.OperationalError:
    try:
        psycopg.connect(f"postgresql://x@127.0.0.1:{_closed_port()}/x", connect_timeout=5)
    except psycopg.OperationalError as exc:
        return exc
    raise AssertionError("connected to a closed port")


def test_dependency_errors_map_to_retryable_project_errors_through_wrappers() -> None:
    failed = errors.from_third_party(CommitFailedException("branch main has changed"))
    assert isinstance(failed, errors.WriteConflict) and failed.retryable
    unknown = errors.from_third_party(CommitStateUnknownException("connection reset"))
    assert isinstance(unknown, errors.CommitStateUnknown) and unknown.retryable
    down = errors.from_third_party(_real_connection_error())
    assert isinstance(down, errors.PostgresUnavailable)
    try:
        try:
            raise CommitFailedException("requirement failed")
        except CommitFailedException as inner:
            raise RuntimeError("step failed") from inner
    except RuntimeError as wrapped:
        assert isinstance(errors.from_third_party(wrapped), errors.WriteConflict)
    assert errors.from_third_party(KeyError("a bug")) is None


def test_a_rest_catalogs_refusal_is_terminal_and_its_absence_or_server_error_retryable() -> None:
    from pyiceberg.exceptions import (
        ForbiddenError,
        ServerError,
        ServiceUnavailableError,
        UnauthorizedError,
    )

    for refusal in (ForbiddenError("SignatureDoesNotMatch"), UnauthorizedError("token expired")):
        mapped = errors.from_third_party(refusal)
        assert isinstance(mapped, errors.CatalogRefused) and not mapped.retryable
        assert "client.secret-access-key" in str(mapped)
    for failure in (ServerError("internal"), ServiceUnavailableError("slow down")):
        mapped = errors.from_third_party(failure)
        assert isinstance(mapped, errors.CatalogUnavailable) and mapped.retryable


def _cli_with(raising: BaseException) -> click.Group:
    @click.group(cls=cli._Group)
    def group() -> None: ...

    @group.command()
    def boom() -> None:
        raise raising

    return group


@pytest.mark.parametrize(
    ("exc", "code", "prefix"),
    [
        (errors.BadInput("dataset 'orders': key 'id' is null"), 2, "error: dataset 'orders'"),
        (errors.WriteConflict("dataset 'orders': lost the race"), 75, "error (retryable):"),
        (CommitFailedException("branch main has changed"), 75, "error (retryable): Iceberg"),
        (CommitStateUnknownException("reset"), 75, "error (retryable): Iceberg commit state"),
        (None, 75, "error (retryable): Postgres unreachable"),
        (errors.DatasetNotWritten("dataset 'x' has no table"), 2, "error: dataset 'x'"),
    ],
)
def test_cli_prints_one_line_per_error_with_an_exit_code_that_says_whether_to_retry(
    exc: BaseException | None, code: int, prefix: str
) -> None:
    raising = exc if exc is not None else _real_connection_error()
    result = CliRunner().invoke(_cli_with(raising), ["boom"])
    assert result.exit_code == code, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(prefix), result.output
    assert "Traceback" not in result.output


def test_cli_lets_a_programming_error_keep_its_traceback() -> None:
    result = CliRunner().invoke(_cli_with(KeyError("a bug")), ["boom"])
    assert isinstance(result.exception, KeyError)
