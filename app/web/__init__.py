"""What speaks HTTP: the API and the pages, their dependencies and parameters, templates, the guard."""
