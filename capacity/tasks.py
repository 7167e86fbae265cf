"""The capacity app's tasks, for the worker to register (autodiscovery imports
`capacity.tasks` only): defrag, campaigns (and their proposals), binpack, the runbook and the
GPU map's refresh each live in their package."""
from capacity.binpack import tasks as _binpack_tasks  # noqa: F401
from capacity.campaigns import tasks as _campaigns_tasks  # noqa: F401
from capacity.defrag import tasks as _defrag_tasks  # noqa: F401
from capacity.gpumap import tasks as _gpumap_tasks  # noqa: F401
from capacity.runbook import tasks as _runbook_tasks  # noqa: F401
