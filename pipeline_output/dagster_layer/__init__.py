"""The Dagster layer: thin mapping from Dagster contexts to the pure core.

`@dataset` and the source factories build assets; `DatasetIOManager` maps an output context to a
publish call; `build_definitions` wires resources, jobs, sensors and checks.
"""
