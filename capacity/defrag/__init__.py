"""Defrag jobs: empty a GPU node safely.

`planning` decides (pure: a snapshot and `now` in, a value out), `services` acts on the
cluster and records what it did, `tasks` run short steps under a lease. The models stay in
`capacity.models`.
"""
