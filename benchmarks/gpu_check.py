"""otel_llm's GPU observers on a real NVIDIA GPU, checked in one command (at most 8 minutes).

    make gpu-deps                                        # once, where pip reaches PyPI
    python benchmarks/gpu_check.py --out gpu-check.json  # on the machine with the GPU

The check is the package ``otel_llm_testing.gpu_check`` (testing/otel_llm_testing/gpu_check/,
whose docstring says what it does); this script runs it from this checkout, so the GPU machine
needs only the repository and ``.gpu-deps``, nothing installed. ``--help`` lists the options.
"""

import sys
from pathlib import Path

# the checkout's testing/ first: the GPU machine has no otel_llm_testing installed, and a
# development machine's may be another checkout's
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testing"))

from otel_llm_testing.gpu_check.__main__ import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
