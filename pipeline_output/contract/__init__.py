"""The vocabulary every layer speaks, with no I/O: dataset specs, partitioning terms, windows, the
decision table, write results, checked input, pushed predicates and the `Store` protocol."""
