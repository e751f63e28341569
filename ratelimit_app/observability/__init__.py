"""Observability: what the limiter did, counted, stored, queried and shown. One module per job:

- `recorder`: decisions counted in process (the reports of `ratelimit_app.service.events`), flushed to
  Redis in batches by a daemon thread; `pending`: the counts not yet in Redis and how they are written;
- `schema`: the Redis keys and hash fields of the metrics;
- `queries`: the stored metrics read back (`get_metrics`, `get_metrics_range`, `recent_metrics`);
- `snapshot`: what this process counted (`process_metrics`), the source of the Prometheus series;
- `prometheus` and `metrics_endpoint`: GET /metrics in the Prometheus text format, and who may read it;
- `dashboard`: the staff-only page in the Django admin;

Importing this package imports nothing else: import each module where it is defined
(`ratelimit_app.observability.recorder`, `.queries`, `.prometheus`, `.dashboard`, ...). Structured logs are
`ratelimit_app.core.logs`, below the layers that write them.
"""
