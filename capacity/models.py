"""Where Django finds the capacity app's models (it imports `capacity.models` only).

Each feature keeps its models in its own package; this module is the one place that
imports them, so that they register with the app. Import a model from its feature
package (`capacity.defrag.models`, `capacity.binpack.models`, `capacity.runbook.models`,
`capacity.campaigns.models`),
not from here.
"""
from capacity.binpack.models import BinpackCluster, BinpackNodeFreed, BinpackRun
from capacity.campaigns.models import Campaign, CampaignNode, CampaignPolicy, CampaignProposal, CampaignRehearsal
from capacity.defrag.models import DefragJob, DefragLogLine, DefragOrphan, DefragRevision
from capacity.runbook.models import ResourceSpec, RunbookAction, ServedModel

__all__ = ["BinpackCluster", "BinpackNodeFreed", "BinpackRun", "Campaign", "CampaignNode", "CampaignPolicy",
           "CampaignProposal", "CampaignRehearsal",
           "DefragJob", "DefragLogLine", "DefragOrphan",
           "DefragRevision", "ResourceSpec", "RunbookAction", "ServedModel"]
