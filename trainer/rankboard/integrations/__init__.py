"""Rankboard inside the training libraries people already use, one line each; each needs its library's extra:

- Lightning (`pip install rankboard[lightning]`): `Trainer(logger=RankboardLogger())`, in
  `rankboard.integrations.lightning`;
- Hugging Face Transformers (`rankboard[hf]`): `Trainer(callbacks=[RankboardCallback()])`, in
  `rankboard.integrations.hf`;
- Accelerate (`rankboard[accelerate]`): `Accelerator(log_with=RankboardTracker())`, in
  `rankboard.integrations.accelerate`.

Each reports its job as a run launched elsewhere (`report.init`): every rank joins the one run, so the dashboard
shows every rank's heartbeat, each node's GPUs and the dumps; metrics come from the rank the library logs on. This
package imports none of the libraries: each module imports its own.
"""
