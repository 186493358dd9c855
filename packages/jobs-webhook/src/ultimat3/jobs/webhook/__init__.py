"""ultimat3-jobs webhook: the factories over ``job()`` — ``webhook()``, ``backfill()``, ``purge()``
and ``export_rows()``.

This release reserves the import name and the distribution; the factories are not shipped yet.
"""

__all__: list[str] = []
