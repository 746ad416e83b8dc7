"""SQL over a session: plain functions that never commit and never raise HTTP errors."""
