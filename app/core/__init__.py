"""The server's ground floor: its settings, database and models, errors, and the shared folder's layout."""
