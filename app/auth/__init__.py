"""Who may do what: passwords, the caller of a request, the role each request needs, and the middleware that checks
Host, Origin, credentials, role and CSRF before any route runs."""
