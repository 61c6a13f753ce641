"""Scheduling policies. Each one is a plain object with ``schedule(view) -> Plan`` (see ``base``)."""

from sim.policies.base import Admission, Limits, Plan, Policy, View
from sim.policies.continuous import ContinuousPolicy
from sim.policies.static import StaticPolicy

__all__ = ["Admission", "ContinuousPolicy", "Limits", "Plan", "Policy", "StaticPolicy", "View"]
