"""What runs beside the requests: the supervisor's tick, the alert sender, the ingest threads."""
