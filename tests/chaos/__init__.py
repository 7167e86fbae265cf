"""Chaos suite: real Celery workers SIGKILLed at random moments while defrag jobs, the
dormancy sweep, binpack, a prune run with its restore and a runbook action run against a
simulated cluster that answers 5xx, 429, 409, slowly and drops watches; after every
scenario the durable-operation invariants are checked.

`pytest tests/chaos` runs a few scenarios (CHAOS_SCENARIOS, CHAOS_SEED);
`python -m tests.chaos --scenarios N --seed S` runs a long soak and prints a summary table.
"""
