"""A run's lifecycle: the one writer of its status (`transitions`) and the supervisor's tick that moves runs on
(`tick`). The user's verbs are app.services.runs; whether a run may be queued or started here is
app.services.admission."""
