"""Where write-audit-publish publishes in Dagster: right after the last blocking check on the
dataset passed, in the same run.

An audited run's IO manager stages the dataset's native write on the branch `audit-<run id>` and
records which blocking checks are planned in the run for that dataset (its *gating* checks). Then:

- every step of the run that can complete the audit — the dataset's own step and each check on it
  — carries one audit hook, run when the step succeeds or fails (attached by `build_definitions`,
  so UI launches, sensors and `pipeline-output materialize` alike run it, whatever the executor);
- after a success the hook publishes (`audit.publish_audit`) once every gating check has a passing
  evaluation in the run's event log: with no gating check, right after the dataset's step; with
  several running in parallel, the last one to finish publishes (publishing is idempotent, and
  serialized by the table lock);
- after a failure — a blocking check that failed with ERROR severity (Dagster fails its step) or
  raised, or the dataset's step failing after staging a window — it fails the audit: main is
  not moved, the branch is kept for `pipeline-output audit show`;
- the IO manager's `load_input` of an audited dataset in its run reads the audited snapshot (the
  user's checks read the branch) and, for a downstream asset (whose blocking checks have all
  passed), publishes first — so a publish that cannot happen (main moved meanwhile) fails the
  downstream step, and the run, instead of feeding it unpublished rows.

A hook cannot fail the run it runs in (Dagster logs a hook error), so a publish refused in a hook
is recorded on the audit (`failed`, with the reason) and logged as an error; `materialize` checks
every audit of its runs and fails when one did not publish.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import dagster as dg

from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.dagster_layer.failures import error_name
from pipeline_output.dagster_layer.resource import RESOURCE_KEY, built_runtime_of, runtime_of
from pipeline_output.services.runtime import Runtime

Gate = Literal["ready", "waiting", "failed"]


def gating_checks(step_context: Any, asset_key: dg.AssetKey) -> list[str]:
    """The blocking checks on `asset_key` planned in this run (they gate its publish)."""
    graph = step_context.job_def.asset_layer.asset_graph
    blocking = {
        key.name
        for key in graph.asset_check_keys
        if key.asset_key == asset_key and graph.get_check_spec(key).blocking
    }
    planned = {
        data.check_name
        for data in _events(
            step_context.instance,
            step_context.run_id,
            dg.DagsterEventType.ASSET_CHECK_EVALUATION_PLANNED,
        )
        if data.asset_key == asset_key
    }
    return sorted(planned & blocking)


def _events(instance: dg.DagsterInstance, run_id: str, kind: dg.DagsterEventType) -> list[Any]:
    """The event-specific data of the run's events of one kind, in order."""
    records = instance.get_records_for_run(run_id, of_type=kind).records
    out: list[Any] = []
    for record in records:
        event = record.event_log_entry.dagster_event
        if event is not None and event.event_specific_data is not None:
            out.append(event.event_specific_data)
    return out


def gate(
    instance: dg.DagsterInstance, run_id: str, asset_key: dg.AssetKey, gating: Iterable[str]
) -> tuple[Gate, str]:
    """Whether the gating checks all passed in the run (`ready`), one failed with ERROR severity
    (`failed`, naming it) or some have not reported yet (`waiting`)."""
    outcome: dict[str, Any] = {
        data.check_name: data
        for data in _events(instance, run_id, dg.DagsterEventType.ASSET_CHECK_EVALUATION)
        if data.asset_key == asset_key
    }
    waiting = []
    for name in gating:
        evaluation = outcome.get(name)
        if evaluation is None:
            waiting.append(name)
        elif not evaluation.passed and evaluation.severity == dg.AssetCheckSeverity.ERROR:
            return "failed", f"blocking check {name!r} failed"
    if waiting:
        return "waiting", f"waiting for {', '.join(waiting)}"
    return "ready", "every blocking check passed"


def try_publish(
    instance: dg.DagsterInstance,
    run_id: str,
    spec: DatasetSpec,
    asset_key: dg.AssetKey,
    log: Any,
    *,
    runtime: Runtime,
) -> Any:
    """Publish the run's audit of `spec` when its gate is open; fail it when a gating check
    failed. Returns the `Published` outcome (None: nothing to publish yet, or nothing staged)."""
    from pipeline_output.services.audit import fail_audit, publish_audit

    audit = runtime.ledger.audit_log.audit(spec.name, run_id)
    if audit is None or audit.state != "staged":
        return None
    state, why = gate(instance, run_id, asset_key, audit.gating_checks)
    if state == "failed":
        fail_audit(runtime.publisher, spec.name, run_id=run_id, reason=why, windows=runtime.windows)
        log.error(f"{spec.name}: audit failed ({why}); main not moved, branch {audit.branch} kept")
        return None
    if state == "waiting":
        return None
    published = publish_audit(runtime.publisher, spec, run_id=run_id, windows=runtime.windows)
    if published is not None:
        log.info(published.message)
    return published


def audited_snapshot(
    context: dg.InputContext, spec: DatasetSpec, *, runtime: Runtime
) -> int | None:
    """In the run that staged an audit of `spec`: the snapshot its inputs read — the audited one
    (published first when the gate is open: a downstream asset never reads unpublished rows that
    cannot be published). None outside such a run (or when the audit staged no snapshot)."""
    step = step_of(context)
    if step is None:  # an input context built outside a run (a user's unit test): no audit
        return None
    audit = runtime.ledger.audit_log.audit(spec.name, step.run_id)
    if audit is None:
        return None
    if audit.state == "staged":
        key = context.upstream_output.asset_key if context.upstream_output else context.asset_key
        try_publish(step.instance, step.run_id, spec, key, context.log, runtime=runtime)
        audit = runtime.ledger.audit_log.audit(spec.name, step.run_id)
        assert audit is not None
    if audit.state in ("failed", "dropped"):
        raise dg.Failure(
            f"{spec.name}: the audit of this run was not published ({audit.reason}); its "
            "unpublished rows are not read"
        )
    return audit.snapshot_id


def step_of(context: dg.InputContext) -> Any:
    """The step an input is loaded for (None for a context built outside a run)."""
    try:
        return context.step_context
    except dg.DagsterInvariantViolationError:
        return None


def _fail_on_step_failure(context: dg.HookContext, spec: DatasetSpec, check: str | None) -> None:
    from pipeline_output.services.audit import fail_audit

    if check is None:
        # the dataset's own step stages its audit with the runtime its process built: a step
        # whose process has none (its control plane never answered) staged nothing, and asking
        # would wait out the connect timeout again
        built = built_runtime_of(context)
        if built is None:
            return
        runtime = built
    else:  # a check step: the dataset's step (maybe another process) staged it
        runtime = runtime_of(context)
    audit = runtime.ledger.audit_log.audit(spec.name, context.run_id)
    if audit is None or audit.state != "staged":
        return
    if check is not None and check not in audit.gating_checks:
        return  # a non-blocking check raised: it does not gate the publish
    error = context.op_exception
    what = f"blocking check {check!r}" if check is not None else f"the step of {spec.name}"
    reason = f"{what} failed" + (f": {error_name(error)}: {error}" if error else "")
    fail_audit(
        runtime.publisher,
        spec.name,
        run_id=context.run_id,
        reason=reason[:1000],
        windows=runtime.windows,
    )
    context.log.error(f"{spec.name}: audit failed ({reason[:300]}); main not moved")


def audit_hooks(
    specs: Mapping[dg.AssetKey, DatasetSpec],
    *,
    name: str,
    checks: Mapping[dg.AssetKey, str] | None = None,
) -> set[dg.HookDefinition]:
    """The audit hook of one step: the dataset step of `specs` (one entry), or a check step
    (`checks`: the check's name per dataset it checks). One hook for both outcomes — it publishes
    when the step succeeded and fails the audit when it failed — so a step records one hook event,
    not a completed and a skipped one (each is a Dagster event written to the run's log; issue 44).
    """
    hook_name = f"po_audit__{name}"

    def _publish(context: dg.HookContext) -> None:
        for key, spec in specs.items():
            try:
                try_publish(
                    context.instance,
                    context.run_id,
                    spec,
                    key,
                    context.log,
                    runtime=runtime_of(context),
                )
            except Exception as exc:
                context.log.error(
                    f"{spec.name}: the audit of run {context.run_id} was not published: "
                    f"{type(exc).__name__}: {' '.join(str(exc).split())[:500]}"
                )
                raise

    def _fail(context: dg.HookContext) -> None:
        for key, spec in specs.items():
            _fail_on_step_failure(context, spec, (checks or {}).get(key))

    def _on_step_end(
        context: dg.HookContext, events: Sequence[dg.DagsterEvent]
    ) -> dg.HookExecutionResult:
        # what `dg.success_hook` and `dg.failure_hook` test, in one hook
        if any(event.is_step_success for event in events):
            _publish(context)
        elif any(event.is_step_failure for event in events):
            _fail(context)
        else:
            return dg.HookExecutionResult(hook_name=hook_name, is_skipped=True)
        return dg.HookExecutionResult(hook_name=hook_name, is_skipped=False)

    return {
        dg.HookDefinition(
            name=hook_name, hook_fn=_on_step_end, required_resource_keys={RESOURCE_KEY}
        )
    }


def with_audit_hooks(
    definition: dg.AssetsDefinition, specs: Mapping[dg.AssetKey, DatasetSpec]
) -> dg.AssetsDefinition:
    """`definition` (a dataset asset, or checks on datasets) with the audit hooks of its step
    (nothing changes for a definition that touches no dataset)."""
    if isinstance(definition, dg.AssetChecksDefinition):
        checked = {k.asset_key: k.name for k in definition.check_keys if k.asset_key in specs}
        if not checked:
            return definition
        own = {k: specs[k] for k in checked}
        return definition.with_hooks(
            audit_hooks(own, name=definition.node_def.name, checks=checked)
        )
    own = {k: specs[k] for k in definition.keys if k in specs}
    if not own:
        return definition
    return definition.with_hooks(audit_hooks(own, name=definition.node_def.name))
