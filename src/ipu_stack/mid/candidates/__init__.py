"""Operator candidates, one module per family; :func:`candidates_for` dispatches."""

from __future__ import annotations

from ipu_stack.mid.candidates.base import Candidate, Footprint
from ipu_stack.mid.candidates.dispatch import candidates_for

__all__ = ["Candidate", "Footprint", "candidates_for"]
