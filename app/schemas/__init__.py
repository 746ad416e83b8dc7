"""Every shape of the REST API, one home each, by the subject the API and the pages name it by."""
