"""The HTML pages, by the same subjects as the API."""
