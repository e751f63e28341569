"""Settings: RATELIMIT read, validated and snapshotted."""
