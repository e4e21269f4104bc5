"""`pipeline-output demo seed|tick`: the demo shop's source tables in the control-plane Postgres."""

from __future__ import annotations

import click

from pipeline_output.infra.settings import get_settings


@click.group()
def demo() -> None:
    """The demo shop: deterministic source data in schema `shop` of the control-plane Postgres."""


@demo.command()
@click.option("--seed", "seed_value", default=42, show_default=True, help="Random seed.")
def seed(seed_value: int) -> None:
    """Create (or reset) the shop's source tables with a deterministic seed."""
    from pipeline_output.demo import shop_data

    url = get_settings().control_plane_url()
    counts = shop_data.seed(url, seed=seed_value)
    click.echo("seeded: " + ", ".join(f"{k}={v}" for k, v in counts.items()))


@demo.command()
def tick() -> None:
    """Advance the shop by one day: new orders/events/customers, changed customers and products."""
    from pipeline_output.demo import shop_data

    url = get_settings().control_plane_url()
    out = shop_data.tick(url)
    click.echo("tick: " + ", ".join(f"{k}={v}" for k, v in out.items()))
