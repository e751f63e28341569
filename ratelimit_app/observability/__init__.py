"""Observability: what the limiter did, counted, stored, queried and shown.

- `logs`: structured log records of the logger "ratelimit_app", API keys redacted.
- `dashboard`: the staff-only page in the Django admin.
- `prometheus` and `metrics_endpoint`: GET /metrics, this process's series in the Prometheus text format,
  and who may read them.

The stable import paths are the modules outside this package: `ratelimit_app.metrics`,
`ratelimit_app.logs`, `ratelimit_app.prometheus` and `ratelimit_app.dashboard` re-export the public
names of the modules here. Importing this package imports nothing else.
"""
