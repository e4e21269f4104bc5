"""Frames in and out of a compute, in the library the user already works with.

An input parameter annotated `pl.LazyFrame` (or not annotated) receives a LazyFrame — projection
and filters pushed down to the arm when it is collected; one annotated `pl.DataFrame`,
`pd.DataFrame` or `pa.Table` receives that type, read once (every column) before the compute
runs. A compute may return polars (eager or lazy), pandas or Arrow; the write converts it once
(`contract.checked_input.to_polars`). pandas is optional: it is imported only when a compute
annotates or returns a pandas frame. An annotation of anything else fails when the code location
loads, naming the dataset and the parameter. A parameter annotated `pipeline_output.Changes`
receives the upstream's changes since this dataset's last run (`dagster_layer/changes_assets.py`).
"""

from __future__ import annotations

import functools
import inspect
import sys
import typing
from collections.abc import Callable, Collection, Mapping
from typing import Any, Literal

import dagster as dg
import polars as pl
import pyarrow as pa

from pipeline_output.errors import BadInput, InvalidSpec
from pipeline_output.services.incremental import Changes

FrameKind = Literal["lazy", "polars", "pandas", "arrow", "changes"]

# annotation spellings when the annotation is a string that cannot be evaluated (e.g. pandas
# imported under TYPE_CHECKING): the last two dotted parts
_SPELLINGS: dict[str, FrameKind] = {
    "pl.LazyFrame": "lazy",
    "polars.LazyFrame": "lazy",
    "pl.DataFrame": "polars",
    "polars.DataFrame": "polars",
    "pd.DataFrame": "pandas",
    "pandas.DataFrame": "pandas",
    "pa.Table": "arrow",
    "pyarrow.Table": "arrow",
    "LazyFrame": "lazy",
    "Changes": "changes",
    "pipeline_output.Changes": "changes",
    "po.Changes": "changes",
}


def input_kinds(
    fn: Callable[..., Any], *, dataset: str, params: Collection[str] | None = None
) -> dict[str, FrameKind]:
    """What each input parameter of `fn` receives, from its annotation (checked at load);
    `params`: the parameters that are inputs (default all; not a partitioned compute's
    `partition_key`)."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # a name only imported for type checkers: read the strings instead
        hints = {}
    kinds: dict[str, FrameKind] = {}
    for param in inspect.signature(fn).parameters.values():
        if params is not None and param.name not in params:
            continue
        annotation = hints.get(param.name, param.annotation)
        kind = _kind_of(annotation)
        if kind is None:
            raise InvalidSpec(
                f"@dataset {dataset!r}: parameter {param.name!r} is annotated {annotation!r}; "
                "an input is a pl.LazyFrame (default), pl.DataFrame, pd.DataFrame, pa.Table or "
                "pipeline_output.Changes (`context` takes Dagster's context; `partition_key` a "
                "partitioned dataset's key)"
            )
        kinds[param.name] = kind
    return kinds


def _kind_of(annotation: Any) -> FrameKind | None:
    if annotation is inspect.Parameter.empty or annotation is Any or annotation is object:
        return "lazy"
    if isinstance(annotation, str):
        text = annotation.strip().strip("'\"")
        return _SPELLINGS.get(".".join(text.split(".")[-2:])) or _SPELLINGS.get(text)
    if annotation is pl.LazyFrame:
        return "lazy"
    if annotation is Changes:
        return "changes"
    if annotation is pl.DataFrame:
        return "polars"
    if annotation is pa.Table:
        return "arrow"
    if _is_pandas_frame_type(annotation):
        return "pandas"
    return None


def _is_pandas_frame_type(annotation: Any) -> bool:
    """Whether `annotation` is `pandas.DataFrame` (without importing pandas)."""
    return (
        isinstance(annotation, type)
        and annotation.__name__ == "DataFrame"
        and annotation.__module__.split(".")[0] == "pandas"
    )


def as_kind(frame: pl.LazyFrame | pl.DataFrame, kind: FrameKind) -> Any:
    """`frame` (an input as the arms read it) as the type the parameter asked for."""
    if kind == "lazy" or kind == "changes":
        return frame.lazy() if isinstance(frame, pl.DataFrame) else frame
    eager = frame.collect() if isinstance(frame, pl.LazyFrame) else frame
    if kind == "polars":
        return eager
    if kind == "arrow":
        return eager.to_arrow()
    return eager.to_pandas()


def as_annotated(value: Any, annotation: Any) -> Any:
    """An input loaded for a parameter outside a `@dataset` (a plain `@asset`, an asset check,
    an op) as its annotation asks, as Dagster's polars IO managers give it: `pl.DataFrame`
    collected, `pd.DataFrame`, `pa.Table`; a `pl.LazyFrame` when it says so or says nothing
    (`Any`); anything else (`dict[str, pl.DataFrame]`, a type of the user's) as it is."""
    kind = _kind_of(annotation)
    if kind is None or kind == "changes":
        return value
    return convert_input(value, kind)


def convert_inputs(inputs: Mapping[str, Any], kinds: Mapping[str, FrameKind]) -> dict[str, Any]:
    """Every input converted to its parameter's kind (unknown parameters: a LazyFrame). A frame
    an upstream's own IO manager loaded (polars, pandas, Arrow) is converted too; one already of
    the asked type is passed as is."""
    return {name: convert_input(value, kinds.get(name, "lazy")) for name, value in inputs.items()}


def convert_input(value: Any, kind: FrameKind) -> Any:
    """One input as its parameter's kind (anything but a frame passed as is)."""
    if (kind == "arrow" and isinstance(value, pa.Table)) or (
        kind == "pandas" and is_pandas_frame(value)
    ):
        return value
    if isinstance(value, pa.Table):
        value = pl.from_arrow(value)
    elif is_pandas_frame(value):
        value = pl.from_pandas(value)
    if isinstance(value, (pl.DataFrame, pl.LazyFrame)):
        return as_kind(value, kind)
    return value


def typed_inputs(fn: Callable[..., Any], kinds: Mapping[str, FrameKind]) -> Callable[..., Any]:
    """`fn` called with its inputs converted to its parameters' kinds (other keyword arguments,
    such as `partition_key`, passed as is); same signature as `fn`."""

    @functools.wraps(fn)
    def call(**kwargs: Any) -> Any:
        return fn(**{k: convert_input(v, kinds[k]) if k in kinds else v for k, v in kwargs.items()})

    return call


def is_pandas_frame(value: Any) -> bool:
    """Whether `value` is a pandas DataFrame (pandas is never imported to find out)."""
    pandas = sys.modules.get("pandas")
    return pandas is not None and isinstance(value, pandas.DataFrame)


def check_output(dataset: str, out: Any) -> None:
    """Refuse a compute result that is no frame, before any I/O (`BadInput`)."""
    if isinstance(out, (pl.DataFrame, pl.LazyFrame, pa.Table)) or is_pandas_frame(out):
        return
    if isinstance(out, (dg.Output, dg.MaterializeResult)):
        raise BadInput(
            f"dataset {dataset!r}: the compute returned dg.{type(out).__name__}; return the frame "
            "itself, and add metadata with the compute's `context.add_output_metadata(...)` "
            "(nothing was written)"
        )
    raise BadInput(
        f"dataset {dataset!r}: the compute returned {type(out).__name__}; expected a polars "
        "DataFrame or LazyFrame, a pandas DataFrame or a pyarrow Table (nothing was written)"
    )
