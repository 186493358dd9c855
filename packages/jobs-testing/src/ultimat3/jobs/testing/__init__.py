"""ultimat3-jobs testing: the driver conformance suite, run_jobs() and service fixtures."""
