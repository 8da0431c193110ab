"""``torchfeed bench``: end-to-end input-pipeline benchmarks, baseline vs torchfeed."""
