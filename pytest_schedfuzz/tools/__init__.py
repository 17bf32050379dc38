"""Tools around the harness: the pre-merge gate, mutation testing and benchmarks."""
