"""The benchmarks (bench/), run at their tiniest as the docs cite them."""
