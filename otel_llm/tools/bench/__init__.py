"""``otel-llm bench``: capacity under load, with the definitions of ``vllm bench serve``.

``load`` runs the levels (closed or open loop), ``stats`` turns them into the figures, ``workload``
says what one request is; ``cli`` is the command.
"""

from otel_llm.tools.bench.load import Level, LevelResult, RequestRecord, run_level
from otel_llm.tools.bench.stats import knee, parse_slo, percentile, summarize
from otel_llm.tools.bench.workload import Workload

__all__ = ["Level", "LevelResult", "RequestRecord", "Workload", "knee", "parse_slo", "percentile", "run_level",
           "summarize"]
