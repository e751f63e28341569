"""DRF's own throttling tests, run against our drop-ins: the module DRF ships as tests/test_throttling.py
in its sdist, fetched at test time (upstream.py). Its names are this module's, so pytest collects its
tests here, exactly as DRF's own run collects that file."""

from __future__ import annotations

from .upstream import drf_throttling_tests

globals().update({name: value for name, value in vars(drf_throttling_tests()).items() if not name.startswith("__")})
