"""``otel-llm diagnose``: find where a slow model call spends its time.

Every trial is a real call traced by otel_llm; the results are read from the call spans'
attributes (``llm.client.*``, ``llm.runtime.*``, ``llm.diagnosis.*``) and phase spans, then
turned into verdicts with stable codes (see :mod:`otel_llm.tools.diagnose.verdicts`).
"""

from __future__ import annotations

from .trials import TargetResult, Trial
from .verdicts import CODES, Verdict, verdicts

__all__ = ["CODES", "TargetResult", "Trial", "Verdict", "verdicts"]
