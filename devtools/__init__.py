"""Tools for developing ratelimit_app (the demo, the test suite, the benchmarks); not part of the package."""
