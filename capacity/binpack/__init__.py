"""Binpack: pod-deletion costs that make scale-down free whole GPU nodes.

`models` record every run, `planning` decides the costs (pure: a snapshot in, a plan
out), `services` write them through the gateway and record the run, `tasks` run them on
the schedule, `admin` shows the runs and offers "run binpack now".
"""
