"""Gateway mode: the tiers, keys and Redis limits of this app decide requests for services that are not
Django, asked by a gateway (nginx, Caddy, Traefik, Envoy) before it passes each request on (docs/gateway.md)."""
