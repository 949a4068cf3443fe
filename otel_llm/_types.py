"""Types shared across the SDK's packages."""

from __future__ import annotations

from typing import Dict, Mapping

from opentelemetry.util.types import AttributeValue

__all__ = ["AttributeMap", "Attributes", "AttributeValue"]

Attributes = Dict[str, AttributeValue]  # span or metric attributes being built
AttributeMap = Mapping[str, AttributeValue]  # read only
