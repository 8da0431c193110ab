"""``torchfeed bench``, the end-to-end pipeline benchmark, by concern: the built-in ``dataset``, the
``image_pipelines`` and ``text_pipelines`` (baseline and torchfeed), their ``agreement`` checks,
the per-stage timings (``stages``), the epoch ``runner``, and the printed ``report`` and chart.
(The kernel-level comparisons under pytest-benchmark are the repository's ``bench/``.)"""

__all__: list[str] = []
