"""Orgs: activity, dormancy and scale to zero (seed 004)."""
