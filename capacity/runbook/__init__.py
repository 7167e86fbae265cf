"""The model-serving runbook: the model registry and the operator's fixes for serving on
scarce GPUs (redeploy, delete the old revision, delete a stuck model, resource specs).

`models` hold the registry, the specs and the audit, `planning` decides from what the
cluster holds (pure), `services` act through the gateway and audit, `tasks` sync the
registry on the schedule, `admin` is where an operator acts.
"""
