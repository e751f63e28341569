"""Observability: what the limiter did, counted (`recorder`), stored (`pending`, `schema`), read back (`queries`,
`snapshot`) and shown (`prometheus`, `metrics_endpoint`, `dashboard`); docs/observability.md. Importing this
package imports nothing else: import each name from the module that defines it."""
