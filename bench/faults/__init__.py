"""The fault-injection harness: the demo under gunicorn and uvicorn against a store that misbehaves, one
fault at a time, measured from outside (`python -m bench.faults.run`; docs/reliability.md)."""
