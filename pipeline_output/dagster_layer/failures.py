"""Domain errors at the Dagster boundary: each reaches Dagster as one `dg.Failure` line.

What Dagster calls in a run or a tick — the IO manager's `handle_output` / `load_input`, a
dataset's or model node's body (its checks included), the stand-alone checks, a source's
observation, the maintenance op, the sensors — runs under `failing_as_dagster(dataset)`. A
`PipelineOutputError` raised there becomes a `dg.Failure`:

- description: the error's one line, naming the dataset (prefixed `dataset 'name': ` unless the
  line names it, or starts with the dataset it is about: an input's upstream);
- metadata: the error's class (`error`), the dataset (`dataset`), and whether running again as
  it is may succeed (`retryable`);
- `allow_retries`: the error's kind — a `RetryableError` (control plane unreachable, a lock
  busy, a commit conflict) lets a retry policy retry, a `TerminalError` (bad input, an invalid
  spec or setting) fails the step at once;
- raised `from None`: Dagster prints the line and the raising frame, not our frames and the
  dependency's error under them, once for the step and once more for the run. The whole chain
  goes to this module's logger (`pipeline_output.dagster_layer.failures`) at DEBUG.

Anything else — the user's own code raising — passes through untouched, with its traceback.
So does the user's error a domain error wraps (a model's `predict` that raised): the `Failure` is
raised from it, and Dagster prints where in the user's code it happened.
"""

from __future__ import annotations

import logging
import os
import sysconfig
from collections.abc import Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from types import TracebackType
from typing import Any

import dagster as dg

from pipeline_output.errors import PipelineOutputError, from_third_party

ERROR_KEY = "error"
DATASET_KEY = "dataset"
RETRYABLE_KEY = "retryable"

_log = logging.getLogger(__name__)
_PACKAGE = str(Path(__file__).parents[1])


def failing_as_dagster(dataset: str | None) -> AbstractContextManager[None]:
    """A block whose `PipelineOutputError` leaves as `as_failure(error, dataset=dataset)`."""
    return _AsFailure(dataset)


class _AsFailure(AbstractContextManager[None]):
    """`failing_as_dagster`'s context manager: a class, not a `@contextmanager` generator, so
    the traceback Dagster prints has two frames of ours (the boundary's `with` and this raise),
    not contextlib's two as well."""

    def __init__(self, dataset: str | None) -> None:
        self._dataset = dataset

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if isinstance(exc, PipelineOutputError):
            _log.debug("%s failed", self._dataset or "pipeline-output", exc_info=exc)
            raise as_failure(exc, dataset=self._dataset) from _user_cause(exc)


def as_failure(error: PipelineOutputError, *, dataset: str | None) -> dg.Failure:
    """The `dg.Failure` Dagster is given for `error` (module docstring)."""
    line = " ".join(str(error).split()) or type(error).__name__
    if dataset is not None and not _names(line, dataset):
        line = f"dataset {dataset!r}: {line}"
    metadata: dict[str, Any] = {ERROR_KEY: type(error).__name__, RETRYABLE_KEY: error.retryable}
    if dataset is not None:
        metadata[DATASET_KEY] = dataset
    return dg.Failure(description=line, metadata=metadata, allow_retries=error.retryable)


def failure_retryable(metadata: Mapping[str, Any] | None) -> bool | None:
    """Whether the failure `as_failure` made with `metadata` may succeed when run again; None
    for any other `Failure` (metadata values as raised, or as Dagster stored them)."""
    raw = (metadata or {}).get(RETRYABLE_KEY)
    value = getattr(raw, "value", raw)
    if ERROR_KEY not in (metadata or {}) or not isinstance(value, bool):
        return None
    return value


def error_name(exc: BaseException) -> str:
    """The class name of the error `exc` stands for: a `Failure` `as_failure` made says the
    pipeline-output error's; any other error is its own."""
    if isinstance(exc, dg.Failure) and failure_retryable(exc.metadata) is not None:
        raw = exc.metadata[ERROR_KEY]
        return str(getattr(raw, "value", raw))
    return type(exc).__name__


def _names(line: str, dataset: str) -> bool:
    """Whether `line` names a dataset already: this one, or the one the error is about (an
    input's upstream in a step's `load_input`: `dataset 'up': ...`, not `dataset 'down':
    dataset 'up': ...` — the step is named by Dagster's own line)."""
    return repr(dataset) in line or line.startswith((f"{dataset}:", "dataset '", 'dataset "'))


def _user_cause(error: PipelineOutputError) -> BaseException | None:
    """The first error in `error`'s causes raised in the user's code (a frame outside this
    package, the standard library and the installed packages), else None."""
    seen: set[int] = set()
    cause = error.__cause__
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        known = isinstance(cause, PipelineOutputError) or from_third_party(cause) is not None
        if not known and _raised_in_user_code(cause):
            return cause
        cause = cause.__cause__
    return None


def _raised_in_user_code(exc: BaseException) -> bool:
    paths = sysconfig.get_paths()
    dirs = [_PACKAGE, *(paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib"))]
    library = tuple(os.path.join(d, "") for d in dirs)  # a directory, not a name's prefix
    tb = exc.__traceback__
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if not filename.startswith(("<", *library)):
            return True
        tb = tb.tb_next
    return False
