"""Gateway mode: the tiers, keys and Redis limits of this app for services that are not Django.

A gateway (nginx, Caddy, Traefik, Envoy) asks the endpoint about each request before passing it to the
service behind it, and passes or refuses it by the answer:
`path("ratelimit/", include("ratelimit_app.gateway.urls"))`, or under ASGI
`include("ratelimit_app.gateway.async_urls")` (docs/gateway.md has each gateway's configuration).

- `guard`: who may call it (RATELIMIT['GATEWAY_SECRET'], RATELIMIT['GATEWAY_NETWORKS']): gateways only;
- `describe`: the request a gateway describes (method, URI, service, cost), read from its headers;
- `answers`: the 200 with the rate limit headers, the refusals, and nginx's 403 carrying them;
- `lease`: concurrency slots handed to the gateway as one signed header value;
- `views`: the endpoint (one decision through `ratelimit_app.apply.limiting`), the confirmation and the
  release of slots, each with its async twin;
- `urls`, `async_urls`: the endpoint's URLs, with the sync views or their async twins;
- `checks`: `manage.py check` warns when the middleware would limit the endpoint itself (ratelimit.W003),
  and reports an endpoint routed with no guard (ratelimit.E006).
"""
