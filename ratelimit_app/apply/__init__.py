"""Request handling: what every entry point (the middleware, the DRF throttles, the view decorators)
shares: who the client is and which limits apply, one decision per request, the HTTP answer and its
headers, concurrency slots, load shedding. The entry points themselves live at the package root
(`ratelimit_app.middleware`, `.throttling`, `.decorators`) and import from here, never the reverse.
"""
