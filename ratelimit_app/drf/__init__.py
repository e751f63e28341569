"""What our DRF throttles (ratelimit_app.throttling) are built on: `joint` (their base, `JointThrottle`,
deciding every throttle of ours on a view in one call) and `exceptions` (the 401, 403 and 503 they
raise)."""
