"""The web process: ingest API, Slack and Teams endpoints, preferences, /metrics."""
