"""The REST API under /api: everything the pages do, as JSON, documented at /docs."""
