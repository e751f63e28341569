"""The ways a project applies limits to requests: the middleware, the DRF throttles and the view
decorators, and what they share (who the client is and which limits apply, one decision per request,
the HTTP answer and its headers, concurrency slots, load shedding).

Their public names keep their stable import paths at the package root: `ratelimit_app.middleware`,
`.throttling`, `.decorators`, `.routes` and `.limiting` re-export them.
"""
