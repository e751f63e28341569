"""Observability: what the limiter did, counted, stored, queried and shown. One module per job:

- `recorder`: decisions counted in process (`record_decision` and the service's reports), flushed to
  Redis in batches by a daemon thread; `pending`: the counts not yet in Redis and how they are written;
- `schema`: the Redis keys and hash fields of the metrics;
- `queries`: the stored metrics read back (`get_metrics`, `get_metrics_range`, `recent_metrics`);
- `snapshot`: what this process counted (`process_metrics`), the source of the Prometheus series;
- `prometheus` and `metrics_endpoint`: GET /metrics in the Prometheus text format, and who may read it;
- `dashboard`: the staff-only page in the Django admin;
- `logs`: structured log records of the logger "ratelimit_app", API keys redacted.

The stable import paths are the modules outside this package: `ratelimit_app.metrics`,
`ratelimit_app.logs`, `ratelimit_app.prometheus` and `ratelimit_app.dashboard` re-export the public
names of the modules here. Importing this package imports nothing else.
"""
