"""Orgs: activity, dormancy and scale to zero."""
