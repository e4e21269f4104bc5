"""The model node on real parts: a delta source scored window by window (and a plain source in
key batches), every prediction written as ONE replace snapshot carrying `__source_row_index__`,
predictions joined back to the source both by that index and by primary key, re-materialisation
replacing the output, and a failing / misbehaving `predict` leaving the previous output untouched.
"""

from __future__ import annotations

from typing import Any

import dagster as dg
import polars as pl
import psycopg
import pytest
from polars.testing import assert_frame_equal

from pipeline_output import Delta, build_definitions, dataset, model_node, postgres_source
from pipeline_output.dagster_layer.resource import get_runtime
from pipeline_output_tests.dagster_runs import failure_errors, requested_keys
from pipeline_output_tests.oracle import assert_same_multiset

ROW_INDEX = "__source_row_index__"
PREFIX = "pipeline-output."

# --- helpers ---------------------------------------------------------------------------------------


def tick(defs: dg.Definitions, instance: dg.DagsterInstance, name: str) -> list[str]:
    sensor = defs.get_sensor_def(f"{name}__window_sensor")
    result = sensor(dg.build_sensor_context(instance=instance, definitions=defs))
    assert isinstance(result, dg.SensorResult)
    for req in result.dynamic_partitions_requests or []:
        instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
    return sorted(requested_keys(result, instance))


def apply_windows(
    defs: dg.Definitions, instance: dg.DagsterInstance, name: str, keys: list[str]
) -> None:
    if not keys:
        return
    job = defs.resolve_implicit_global_asset_job_def()
    result = job.execute_in_process(
        instance=instance,
        asset_selection=[dg.AssetKey(name)],
        tags={
            "dagster/asset_partition_range_start": keys[0],
            "dagster/asset_partition_range_end": keys[-1],
        },
    )
    assert result.success


def materialise(
    defs: dg.Definitions, instance: dg.DagsterInstance, name: str, *, raise_on_error: bool = True
) -> dg.ExecuteInProcessResult:
    job = defs.resolve_implicit_global_asset_job_def()
    return job.execute_in_process(
        instance=instance, asset_selection=[dg.AssetKey(name)], raise_on_error=raise_on_error
    )


def failure_text(result: dg.ExecuteInProcessResult) -> str:
    texts = []
    for event in result.all_events:
        if event.event_type_value == "STEP_FAILURE":
            error = event.event_specific_data.error  # type: ignore[union-attr]
            texts.append(error.to_string() if error is not None else "")
    return "\n".join(texts)


def output_table(name: str) -> Any:
    return get_runtime().iceberg.load(name)


def node_order(source: str, watermark: str, pk: list[str], snapshot_id: int) -> pl.DataFrame:
    """Re-read the source the way the node documents it: the ledger's applied windows in order,
    each window's rows in primary-key order, at the source snapshot the node recorded."""
    table = get_runtime().iceberg.load(source)
    assert table is not None
    whole = pl.from_arrow(table.scan(snapshot_id=snapshot_id).to_arrow())
    assert isinstance(whole, pl.DataFrame)
    parts = []
    for row in get_runtime().windows.applied_windows(source):
        parts.append(whole.filter(row.window.contains(watermark)).sort(pk))
    ordered = pl.concat(parts)
    assert ordered.height == whole.height, "the applied windows cover every source row"
    return ordered.with_row_index(ROW_INDEX).with_columns(pl.col(ROW_INDEX).cast(pl.Int64))


def assert_dense_unique_index(out: pl.DataFrame) -> None:
    assert out.schema[ROW_INDEX] == pl.Int64
    assert out[ROW_INDEX].n_unique() == out.height
    assert sorted(out[ROW_INDEX].to_list()) == list(range(out.height))


# --- the demo: customer_churn over the delta dataset customers -----------------------------------


def _churn_by_pk(preds: pl.DataFrame, source: pl.DataFrame) -> pl.DataFrame:
    """Predictions joined to the source by key, with the model applied again to the joined rows."""
    from pipeline_output.demo.computes import CHURN_FEATURES, churn_score

    joined = preds.join(source, on="customer_id", how="inner")
    again = churn_score(joined.select(CHURN_FEATURES))
    return joined.select(ROW_INDEX, "customer_id", "churn_probability").with_columns(
        again["churn_probability"].alias("recomputed")
    )


def test_demo_churn_two_windows_one_snapshot_row_index_joins_back_and_rematerialise_replaces(
    env, instance
):
    from pipeline_output.demo import shop_data
    from pipeline_output.demo.code_location import demo_definitions

    shop_data.seed(env)
    defs = demo_definitions()
    apply_windows(defs, instance, "customers", tick(defs, instance, "customers"))
    shop_data.tick(env)
    apply_windows(defs, instance, "customers", tick(defs, instance, "customers"))
    assert len(get_runtime().windows.applied_windows("customers")) == 2

    out = materialise(defs, instance, "customer_churn")
    table = output_table("customer_churn")
    assert len(table.snapshots()) == 1, "two windows -> exactly one snapshot"
    snap = table.current_snapshot()
    preds = pl.from_arrow(table.scan().to_arrow())
    source = get_runtime().iceberg.read("customers")
    assert preds.height == source.height
    assert_dense_unique_index(preds)
    assert sorted(preds["customer_id"].to_list()) == sorted(source["customer_id"].to_list())

    # the snapshot records the source snapshot and the windows read
    source_snapshot = int(snap.summary[f"{PREFIX}model-source-snapshot"])
    assert source_snapshot == get_runtime().iceberg.load("customers").current_snapshot().snapshot_id
    assert snap.summary[f"{PREFIX}model-windows"].count("window") == 2
    meta = out.get_asset_materialization_events()[-1].materialization.metadata
    assert getattr(meta["rows_scored"], "value", None) == source.height
    assert getattr(meta["batches_read"], "value", None) == 2

    # joining back by __source_row_index__ (re-reading in the node's order) == joining by key
    reread = node_order("customers", "updated_seq", ["customer_id"], source_snapshot)
    by_index = preds.join(reread, on=ROW_INDEX, how="inner", suffix="_src")
    assert by_index.height == preds.height
    assert (by_index["customer_id"] == by_index["customer_id_src"]).all()
    by_pk = _churn_by_pk(preds, source)
    assert (by_pk["churn_probability"] - by_pk["recomputed"]).abs().max() < 1e-9
    index_side = by_index.select(ROW_INDEX, "customer_id", "churn_probability").sort(ROW_INDEX)
    pk_side = by_pk.select(ROW_INDEX, "customer_id", "churn_probability").sort(ROW_INDEX)
    assert_frame_equal(index_side, pk_side)

    # a shop tick, a new window, re-materialise: replaced, one more snapshot (not one per window)
    shop_data.tick(env)
    apply_windows(defs, instance, "customers", tick(defs, instance, "customers"))
    assert len(get_runtime().windows.applied_windows("customers")) == 3
    materialise(defs, instance, "customer_churn")
    table = output_table("customer_churn")
    assert len(table.snapshots()) == 2
    preds2 = pl.from_arrow(table.scan().to_arrow())
    source2 = get_runtime().iceberg.read("customers")
    assert preds2.height == source2.height > source.height
    assert_dense_unique_index(preds2)
    assert preds2["customer_id"].n_unique() == preds2.height
    assert set(preds2["customer_id"].to_list()) == set(source2["customer_id"].to_list())
    by_pk2 = _churn_by_pk(preds2, source2)
    assert (by_pk2["churn_probability"] - by_pk2["recomputed"]).abs().max() < 1e-9


# --- a small source with five windows and a controllable predict ---------------------------------


class Scorer:
    """A deterministic predict whose behaviour the test switches (calls are counted)."""

    def __init__(self) -> None:
        self.calls = 0
        self.mode = "ok"
        self.fail_on: int | None = None
        self.seen_columns: list[list[str]] = []

    def __call__(self, frame: pl.DataFrame) -> Any:
        self.calls += 1
        self.seen_columns.append(frame.columns)
        if self.fail_on is not None and self.calls == self.fail_on:
            raise RuntimeError(f"model blew up on call {self.calls}")
        score = frame.select((pl.col("x") * 2 + pl.col("bump")).alias("score"))
        if self.mode == "short":
            return score.head(frame.height - 1)
        if self.mode == "long":
            return pl.concat([score, score.head(1)])
        if self.mode == "list":
            return score["score"].to_list()
        if self.mode == "arrow":
            return score.to_arrow()
        if self.mode == "none":
            return None
        return score


def make_people(url: str, n: int = 50) -> None:
    with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(
            "CREATE TABLE people (id bigint PRIMARY KEY, x bigint, bump bigint, seq bigint)"
        )
        # ids deliberately not in watermark order, so window order != key order
        cur.executemany(
            "INSERT INTO people VALUES (%s, %s, %s, %s)",
            [((i * 37) % 101 + 1, i, i % 3, i) for i in range(1, n + 1)],
        )


def people_defs(
    scorer: Any,
    *,
    delta: bool = True,
    batch_rows: int = 100_000,
    features: list[str] | None = None,
    mode: Any = "iceberg",
) -> tuple[dg.Definitions, str]:
    raw = postgres_source("people", table="people", watermark="seq")

    @dataset(
        "people_copy",
        primary_key="id",
        strategy="snapshot_replace",
        mode="iceberg",
        delta=Delta(source="people", watermark="seq", max_rows=10) if delta else None,
    )
    def people_copy(people: pl.LazyFrame) -> pl.DataFrame:
        return people.collect()

    node = model_node(
        "people_score",
        source=people_copy,
        predict=scorer,
        features=features or ["x", "bump"],
        mode=mode,
        batch_rows=batch_rows,
    )
    return build_definitions(datasets=[people_copy], sources=[raw], assets=[node]), "people_score"


@pytest.fixture
def five_windows(env: str, instance: dg.DagsterInstance) -> Any:
    make_people(env)
    scorer = Scorer()
    defs, node = people_defs(scorer)
    keys = tick(defs, instance, "people_copy")
    assert len(keys) == 5
    apply_windows(defs, instance, "people_copy", keys)
    return defs, node, scorer


def test_predict_sees_only_the_features_and_rows_map_back_by_index(five_windows, instance):
    defs, node, scorer = five_windows
    materialise(defs, instance, node)
    assert scorer.calls == 5
    assert all(cols == ["x", "bump"] for cols in scorer.seen_columns)
    table = output_table(node)
    preds = pl.from_arrow(table.scan().to_arrow())
    assert set(preds.columns) == {ROW_INDEX, "id", "score"}
    assert_dense_unique_index(preds)
    source = get_runtime().iceberg.read("people_copy")
    assert preds.height == source.height == 50
    snap_src = int(table.current_snapshot().summary[f"{PREFIX}model-source-snapshot"])
    reread = node_order("people_copy", "seq", ["id"], snap_src)
    by_index = preds.join(reread, on=ROW_INDEX, suffix="_src")
    assert (by_index["id"] == by_index["id_src"]).all()
    assert (by_index["score"] == by_index["x"] * 2 + by_index["bump"]).all()
    by_pk = preds.join(source, on="id")
    assert (by_pk["score"] == by_pk["x"] * 2 + by_pk["bump"]).all()


def test_predict_raising_on_window_3_of_5_leaves_the_previous_output_exactly_as_it_was(
    five_windows, instance
):
    defs, node, scorer = five_windows
    materialise(defs, instance, node)
    table = output_table(node)
    before_id = table.current_snapshot().snapshot_id
    before_n = len(table.snapshots())
    before_rows = pl.from_arrow(table.scan().to_arrow())

    scorer.calls = 0
    scorer.fail_on = 3
    result = materialise(defs, instance, node, raise_on_error=False)
    assert not result.success
    text = failure_text(result)
    assert "people_score" in text and "model blew up on call 3" in text
    assert scorer.calls == 3, "the failure happened on the third window"
    # one line naming the node, caused by the user's own error with its traceback (the
    # `predict` in this file), none of pipeline-output's frames under it
    (failure,) = result.get_step_failure_events()
    error = failure.step_failure_data.error
    assert error is not None and error.cls_name == "Failure", text
    assert error.message.startswith("dagster._core.definitions.events.Failure: model node ")
    cause = error.cause
    assert cause is not None and cause.cls_name == "RuntimeError" and cause.cause is None, text
    assert any(__file__ in frame for frame in cause.stack), cause.stack

    table = output_table(node)
    assert table.current_snapshot().snapshot_id == before_id
    assert len(table.snapshots()) == before_n
    assert_same_multiset(pl.from_arrow(table.scan().to_arrow()), before_rows)


BAD_PREDICTS = ("short", "long", "list", "arrow", "none")


def test_predict_with_wrong_length_or_type_fails_naming_the_node_and_writes_nothing(
    five_windows, instance
):
    defs, node, scorer = five_windows
    for bad in BAD_PREDICTS:
        scorer.mode = bad
        result = materialise(defs, instance, node, raise_on_error=False)
        assert not result.success, bad
        assert "people_score" in failure_text(result), (bad, failure_text(result)[-1500:])
        assert output_table(node) is None, f"{bad}: nothing was written (no table created)"

    # with a previous output in place: still untouched
    scorer.mode = "ok"
    materialise(defs, instance, node)
    table = output_table(node)
    before = (table.current_snapshot().snapshot_id, len(table.snapshots()))
    for bad in ("long", "arrow"):
        scorer.mode = bad
        result = materialise(defs, instance, node, raise_on_error=False)
        assert not result.success and "people_score" in failure_text(result), bad
        table = output_table(node)
        assert (table.current_snapshot().snapshot_id, len(table.snapshots())) == before, bad
        assert pl.from_arrow(table.scan().to_arrow()).height == 50


def test_plain_source_is_scored_in_key_batches_with_one_snapshot(env, instance):
    make_people(env, n=30)
    scorer = Scorer()
    defs, node = people_defs(scorer, delta=False, batch_rows=7)
    assert materialise(defs, instance, "people_copy").success
    out = materialise(defs, instance, node)
    assert scorer.calls == 5  # 30 rows in batches of 7
    table = output_table(node)
    assert len(table.snapshots()) == 1
    preds = pl.from_arrow(table.scan().to_arrow())
    assert_dense_unique_index(preds)
    source = get_runtime().iceberg.read("people_copy")
    ordered = (
        source.sort("id").with_row_index(ROW_INDEX).with_columns(pl.col(ROW_INDEX).cast(pl.Int64))
    )
    by_index = preds.join(ordered, on=ROW_INDEX, suffix="_src")
    assert (by_index["id"] == by_index["id_src"]).all()
    assert (by_index["score"] == by_index["x"] * 2 + by_index["bump"]).all()
    meta = out.get_asset_materialization_events()[-1].materialization.metadata
    assert getattr(meta["batches_read"], "value", None) == 5


@pytest.mark.parametrize("source", ["people", dg.AssetKey("people")])
def test_a_source_given_by_name_or_key_fails_at_load_naming_the_model_node(source: Any) -> None:
    """It used to fail with AttributeError: 'str' object has no attribute 'keys'."""
    from pipeline_output.errors import InvalidSpec

    with pytest.raises(InvalidSpec, match=r"model node 'scores'.*@dataset asset itself"):
        model_node("scores", source=source, predict=lambda f: [0.0] * f.height)


def test_model_node_in_iceberg_mode_records_its_deploy_and_status_shows_it(env, instance):
    """The node used to write through `replace_streaming` directly: no deploy row, `status` '-'."""
    from pipeline_output.dagster_layer.dataset import spec_of
    from pipeline_output.services.canary import status

    make_people(env, n=12)
    defs, node = people_defs(Scorer(), delta=False, batch_rows=5)
    assert materialise(defs, instance, "people_copy").success
    out = materialise(defs, instance, node)
    runtime = get_runtime()
    deploys = []
    for _ in range(2):  # re-running replaces the output and records a second deploy
        last = runtime.ledger.deploy_log.last_deploy(node, "iceberg")
        assert last is not None and last.status == "succeeded"
        assert last.write_mode is not None and "replace" in last.write_mode
        assert (
            last.rows_inserted == 12
            and last.snapshot_id == output_table(node).current_snapshot().snapshot_id
        )
        deploys.append(last)
        out = materialise(defs, instance, node)
    assert out.success and deploys[0].snapshot_id != deploys[1].snapshot_id
    assert runtime.ledger.deploy_log.last_deploy(node, "pg") is None
    specs = {
        spec.name: spec
        for spec in (spec_of(a) for a in defs.assets or [] if hasattr(a, "metadata_by_key"))
        if spec is not None
    }
    board = {row.dataset: row for row in status(runtime.publisher, specs)}
    assert board[node].last_iceberg_deploy.startswith("succeeded")
    assert board[node].last_pg_deploy == "-"


def test_a_source_carrying_delete_files_is_scored_without_its_deleted_rows(env, instance):
    from pipeline_output import DatasetSpec

    make_people(env, n=30)
    scorer = Scorer()
    defs, node = people_defs(scorer, delta=False, batch_rows=7)
    assert materialise(defs, instance, "people_copy").success
    store = get_runtime().iceberg
    rows = store.read("people_copy")
    # drop 5 rows and change 3, by position: the source's one data file now has a delete file
    kept = (
        rows.sort("id")
        .slice(5)
        .with_columns(
            bump=pl.when(pl.col("id").is_in(pl.col("id").head(3).implode()))
            .then(pl.col("bump") + 10)
            .otherwise(pl.col("bump"))
        )
    )
    spec = DatasetSpec(
        name="people_copy",
        primary_key=("id",),
        strategy="sync",
        write_strategy_hint="merge-on-read",
    )
    assert store.write(spec, kept).files_merged_on_read == 1
    assert any(t.delete_files for t in store.load("people_copy").scan().plan_files())
    materialise(defs, instance, node)
    preds = pl.from_arrow(output_table(node).scan().to_arrow())
    assert preds.height == kept.height == 25
    assert_dense_unique_index(preds)
    joined = preds.join(kept, on="id", how="inner")
    assert joined.height == 25
    assert (joined["score"] == joined["x"] * 2 + joined["bump"]).all()


# --- predictions matched to their input rows by key, both arms (issue 30, item 2) -----------------

ARMS = ["iceberg", "pg"]


def by_score(frame: pl.DataFrame) -> pl.DataFrame:
    """A model that returns its rows sorted by score, keeping the key column."""
    scored = frame.select("id", (pl.col("x") * 2 + pl.col("bump")).alias("score"))
    return scored.sort("score", descending=True)


def shuffled_by_index(frame: pl.DataFrame) -> pl.DataFrame:
    """A model that returns `__source_row_index__` (asked for in `features`) in shuffled order."""
    scored = frame.select(ROW_INDEX, (pl.col("x") * 2 + pl.col("bump")).alias("score"))
    return scored.sample(fraction=1.0, shuffle=True, seed=7)


def _missing_key(frame: pl.DataFrame) -> pl.DataFrame:
    return by_score(frame).head(frame.height - 1)


def _extra_key(frame: pl.DataFrame) -> pl.DataFrame:
    out = by_score(frame)
    return pl.concat([out, out.head(1).with_columns(id=pl.lit(10_000, dtype=pl.Int64))])


def _duplicate_key(frame: pl.DataFrame) -> pl.DataFrame:
    """Right row count, but the last row repeats the first row's key (one input row unmatched)."""
    out = by_score(frame)
    first = out["id"][0]
    return out.with_columns(
        id=pl.when(pl.int_range(pl.len()) == pl.len() - 1).then(first).otherwise(pl.col("id"))
    )


def _foreign_key(frame: pl.DataFrame) -> pl.DataFrame:
    """Right row count, one key that is no input row's."""
    out = by_score(frame)
    return out.with_columns(
        id=pl.when(pl.int_range(pl.len()) == 0).then(10_000).otherwise(pl.col("id"))
    )


def _null_key(frame: pl.DataFrame) -> pl.DataFrame:
    out = by_score(frame)
    return out.with_columns(
        id=pl.when(pl.int_range(pl.len()) == 0).then(None).otherwise(pl.col("id"))
    )


def _no_key_short(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.select((pl.col("x") * 2 + pl.col("bump")).alias("score")).head(frame.height - 1)


BAD_KEYED = {
    "missing key": (_missing_key, "no row for 1 input row"),
    "extra key": (_extra_key, "whose key is no input row's"),
    "duplicate key": (_duplicate_key, "more than once"),
    "foreign key": (_foreign_key, "whose key is no input row's"),
    "null key": (_null_key, "null key"),
    "no key, wrong row count": (_no_key_short, "must return one row per input row"),
}


def output_rows(node: str, arm: str) -> pl.DataFrame | None:
    """The model node's output on `arm` (None when nothing was ever written there)."""
    runtime = get_runtime()
    if arm == "iceberg":
        table = output_table(node)
        if table is None:
            return None
        frame = pl.from_arrow(table.scan().to_arrow())
        assert isinstance(frame, pl.DataFrame)
        return frame
    if runtime.ledger.deploy_log.last_deploy(node, "pg") is None:
        return None
    return runtime.postgres.read(node)


def output_version(node: str, arm: str) -> Any:
    """What changes with every write of the output: Iceberg snapshots, else the deploy record."""
    if arm == "iceberg":
        table = output_table(node)
        return None if table is None else (table.current_snapshot().snapshot_id, table.snapshots())
    last = get_runtime().ledger.deploy_log.last_deploy(node, "pg")
    return None if last is None else last.id


def assert_scores_belong_to_their_rows(preds: pl.DataFrame) -> None:
    """Oracle: the source re-read with plain polars in the node's documented order; every
    prediction row's key, index and score agree with the source row they name."""
    assert_dense_unique_index(preds)
    source = get_runtime().iceberg.read("people_copy")
    assert preds.height == source.height == 50
    expected = source.select("id", (pl.col("x") * 2 + pl.col("bump")).alias("expected"))
    by_pk = preds.join(expected, on="id", how="inner")
    assert by_pk.height == 50
    assert (by_pk["score"] == by_pk["expected"]).all(), "a score attached to another row's key"
    snap = get_runtime().iceberg.load("people_copy").current_snapshot().snapshot_id
    reread = node_order("people_copy", "seq", ["id"], snap)
    by_index = preds.join(reread, on=ROW_INDEX, suffix="_src")
    assert (by_index["id"] == by_index["id_src"]).all()
    assert (by_index["score"] == by_index["x"] * 2 + by_index["bump"]).all()


@pytest.mark.parametrize("arm", ARMS)
def test_predict_sorting_its_output_by_score_with_the_key_is_joined_on_the_key(env, instance, arm):
    """It used to drop the returned key and re-attach the input keys by position: 50 of 50 rows
    carried another row's score, and the run succeeded."""
    make_people(env)
    defs, node = people_defs(by_score, features=["id", "x", "bump"], mode=arm)
    apply_windows(defs, instance, "people_copy", tick(defs, instance, "people_copy"))
    assert materialise(defs, instance, node).success
    preds = output_rows(node, arm)
    assert preds is not None and set(preds.columns) == {ROW_INDEX, "id", "score"}
    assert_scores_belong_to_their_rows(preds)


@pytest.mark.parametrize("arm", ARMS)
def test_predict_returning_the_row_index_shuffled_is_joined_on_the_index(env, instance, arm):
    make_people(env)
    defs, node = people_defs(shuffled_by_index, features=[ROW_INDEX, "x", "bump"], mode=arm)
    apply_windows(defs, instance, "people_copy", tick(defs, instance, "people_copy"))
    assert materialise(defs, instance, node).success
    preds = output_rows(node, arm)
    assert preds is not None and set(preds.columns) == {ROW_INDEX, "id", "score"}
    assert_scores_belong_to_their_rows(preds)


@pytest.mark.parametrize("arm", ARMS)
def test_predictions_whose_keys_do_not_match_the_input_one_to_one_fail_and_write_nothing(
    env, instance, arm
):
    make_people(env)
    current: dict[str, Any] = {"predict": by_score}
    defs, node = people_defs(
        lambda frame: current["predict"](frame), features=["id", "x", "bump"], mode=arm
    )
    apply_windows(defs, instance, "people_copy", tick(defs, instance, "people_copy"))

    # on a fresh output: nothing is created
    for case, (predict, why) in BAD_KEYED.items():
        current["predict"] = predict
        result = materialise(defs, instance, node, raise_on_error=False)
        assert not result.success, case
        text = failure_text(result)
        assert failure_errors(result) == ["BadInput"], (case, text[-1500:])
        assert "model node 'people_score'" in text and why in text, (
            case,
            text[-1500:],
        )
        assert output_version(node, arm) is None, f"{case}: nothing was written"

    # over a previous output: it stays exactly as it was
    current["predict"] = by_score
    assert materialise(defs, instance, node).success
    before_version, before_rows = output_version(node, arm), output_rows(node, arm)
    for case, (predict, why) in BAD_KEYED.items():
        current["predict"] = predict
        result = materialise(defs, instance, node, raise_on_error=False)
        assert not result.success and why in failure_text(result), case
        assert output_version(node, arm) == before_version, f"{case}: output changed"
        assert_same_multiset(output_rows(node, arm), before_rows)


@pytest.mark.parametrize("arm", ARMS)
def test_predictions_without_key_columns_and_one_row_per_input_row_attach_by_position(
    env, instance, arm
):
    make_people(env)
    scorer = Scorer()
    defs, node = people_defs(scorer, mode=arm)
    apply_windows(defs, instance, "people_copy", tick(defs, instance, "people_copy"))
    assert materialise(defs, instance, node).success
    preds = output_rows(node, arm)
    assert preds is not None
    assert_scores_belong_to_their_rows(preds)
