"""Consolidation campaigns carried out: start from a confirmed plan, one pass at a time, abort.

A campaign frees the nodes of its plan together: every node it frees (and, under the
scheduler's LeastAllocated scoring, every empty node of the pool) is cordoned first, then a
defrag job empties each node in the plan's order, at most `max_in_flight` at once and within
the budgets (`budgets.py`). A node whose job cannot free it, or whose replacements the
scheduler cannot place, is dropped: its job aborted, the campaign's cordon lifted, the reason
recorded. Once every node is safe, drained or dropped, the kept-empty nodes go back to service.

Crash safety is the defrag job's: each pass re-reads what it acts on, every record is one
compare-and-set UPDATE (`record._commit`), every cordon and uncordon is preceded by an intent
on the node's row, and a job and the row naming it are written in one transaction. An abort
is a request in its own columns, taken up by the next pass.

Where each part lives:
  start.py     start (re-plans on a fresh reading and refuses a plan that is no longer true), abort request
  step.py      one pass: cordon, follow, drop, start, done; the abort pass
  budgets.py   whether a node may start now (do-not-disrupt, holds, PodDisruptionBudgets, revision budget)
  cordons.py   the campaign's own cordons, laid and lifted under intents
  record.py    the pass's record (compare-and-set), audit entries, the lease
  proposals.py the scheduled proposals: the best campaign of each pool, shown on the pages
  drive.py     a campaign and its defrag jobs stepped in this process on a clock the caller moves
  rehearsal.py a campaign rehearsed on a copy of the cluster loaded from a dump, and its record
  acting.py    the schedule starting a proposal under the pool's policy (window, node budget), audited
Reads are in capacity/campaigns/selectors.py, decisions in capacity/campaigns/planning.py.
"""
from __future__ import annotations

from capacity.campaigns.services.record import (
    CAMPAIGN_RUN_TASK,
    LEASE_SECONDS,
    CampaignError,
    StaleCampaign,
    campaign_lease_acquire,
    campaign_lease_release,
    campaign_lease_renew,
)
from capacity.campaigns.services.proposals import campaign_proposals_compute
from capacity.campaigns.services.acting import campaign_proposals_act
from capacity.campaigns.services.policies import campaign_policy_delete, campaign_policy_save
from capacity.campaigns.services.start import campaign_abort, campaign_start
from capacity.campaigns.services.step import ERROR_RETRY_SECONDS, campaign_step
from capacity.campaigns.services.drive import campaign_drive, campaign_pass
from capacity.campaigns.services.rehearsal import Rehearsal, RehearsalError, campaign_rehearse

__all__ = [
    "CAMPAIGN_RUN_TASK",
    "ERROR_RETRY_SECONDS",
    "LEASE_SECONDS",
    "CampaignError",
    "StaleCampaign",
    "Rehearsal",
    "RehearsalError",
    "campaign_abort",
    "campaign_drive",
    "campaign_lease_acquire",
    "campaign_lease_release",
    "campaign_lease_renew",
    "campaign_pass",
    "campaign_policy_delete",
    "campaign_policy_save",
    "campaign_proposals_act",
    "campaign_proposals_compute",
    "campaign_rehearse",
    "campaign_start",
    "campaign_step",
]
