"""Where Django finds the capacity app's admin (it autodiscovers `capacity.admin` only).

Each feature registers its own admin in its package; importing them here registers them.
"""
from capacity.binpack import admin as binpack_admin
from capacity.campaigns import admin as campaign_admin
from capacity.defrag import admin as defrag_admin
from capacity.runbook import admin as runbook_admin

__all__ = ["binpack_admin", "campaign_admin", "defrag_admin", "runbook_admin"]
