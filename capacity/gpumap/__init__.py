"""The GPU map and the cluster dashboard: where the GPUs are, and which node to empty.

`planning` draws them from a snapshot (pure), `views` render them. It writes nothing, so it
has no models, services, tasks or admin of its own: starting a defrag job from the map is
the defrag package's work.
"""
