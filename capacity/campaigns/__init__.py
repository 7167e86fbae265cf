"""Consolidation campaigns: free whole GPU nodes of a pool as one plan, every node cordoned
before the first pod moves, each node emptied by a defrag job."""
