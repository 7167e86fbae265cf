"""Defrag jobs: empty a GPU node safely.

`models` hold the job and what it did, `planning` decides (pure: a snapshot and `now` in,
a value out), `services` act on the cluster and record what they did, `tasks` run short
steps under a lease, `admin` and `views` are the operator's pages.
"""
