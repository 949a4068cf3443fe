"""Telemetry of model calls: the sink capture hands calls to (``calls``), the pure builder of a
finished call's result (``build``) and the emitters of spans and metrics."""

__all__: list[str] = []
