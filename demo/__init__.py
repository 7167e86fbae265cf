"""Demo-only controls for `make demo`: move the clock, make a model idle or busy.

They act on the simulated cluster started by `scripts/start_demo.py` and refuse to run
anywhere else (`DEMO_MODE` unset, or a cluster that is not simulated).
"""
