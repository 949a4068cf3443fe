"""otel_llm's GPU observers on a real NVIDIA GPU, checked in one command (at most 8 minutes).

    make gpu-deps                                        # once, where pip reaches PyPI
    python benchmarks/gpu_check.py --out gpu-check.json  # on the machine with the GPU

What it does:

1. Reads the device through NVML (name, UUID, driver, memory, MIG mode and every field the GPU
   observer reads, as the driver returns them) before anything runs on it.
2. Starts a small model server in a child process of its own (the script with ``--serve``): a
   random-weight Llama built on the spot with transformers (a plain torch network where
   transformers cannot build it), generating on the GPU and streaming OpenAI chat completions
   over HTTP on 127.0.0.1. Nothing is downloaded.
3. Instruments this process with ``otel_llm.instrument()`` (in-memory span exporter and metric
   reader) and makes streamed calls to that server while the GPU works, collecting the metrics
   every half second.
4. Runs ``otel-llm bench`` (``python -m otel_llm.tools.main bench``) against the same server.
5. Judges what it saw and writes it all as JSON (``--out``): each check's name, whether it passed,
   its measured values and, when it failed, why. The checks:

   - ``nvml_device``: NVML found the device (name, UUID, driver version, memory).
   - ``torch_cuda``: the server's torch generates on a CUDA device.
   - ``hw_gpu_metrics``: ``hw.gpu.utilization`` above zero during the calls, ``hw.gpu.memory.usage``
     within ``hw.gpu.memory.limit``, the limit equal to NVML's total, ``hw.model`` NVML's name.
   - ``hw_gpu_fields``: every other ``hw.*`` GPU metric has a point, or NVML itself said the
     field is not supported on this device.
   - ``gpu_memory_consistent``: NVML's used memory agrees with the server's
     ``torch.cuda.memory_reserved`` plus what NVML counts beside it (the CUDA context, the
     driver's own share before the server started, other processes).
   - ``process_gpu_memory``: the server's PID has a non-zero ``process.gpu.memory.usage`` point.
   - ``calls``: every streamed call got its tokens and made one call span.
   - ``span_gpu_evidence``: each call span carries ``llm.host.gpu.utilization`` and
     ``llm.host.gpu.memory.usage``, the memory non-zero, the utilization above zero on one at least.
   - ``bench_peak_vram``: ``otel-llm bench`` reported a peak GPU memory for the server's process,
     no less than what torch had reserved.

It exits 0 when every check passed, 1 naming the checks that failed (a run cut by ``--timeout``
fails the check ``timeout``), and 0 with one line saying "no GPU" where there is none to check
(no NVML library, no device, or a torch that sees no CUDA device): then nothing heavy is started.

The whole run stays within ``--timeout`` (default 420 s), then stops what it started. The
device's Python needs torch (and transformers, for the Llama) for the server, nvidia-ml-py,
psutil, httpx and wrapt for otel_llm and, for what a GPU image lacks, the folder ``--deps`` (default
``.gpu-deps`` at the repository's root where it exists; ``make gpu-deps`` fills it with the
OpenTelemetry API and SDK). That folder and the repository go first on this process's path and
on the PYTHONPATH of its children (the server, ``otel-llm bench``). The server stops with this
script, whatever happens (its own process group, ended in a ``finally``; it also ends itself
when this process disappears).

The modules: ``judges`` (the checks: pure functions of readings, each returning a ``Check``, so
the tests feed them sample readings without a GPU), ``nvml`` (NVML read directly), ``server``
(the model server), ``runner`` (the run) and ``__main__`` (the command line, which
``benchmarks/gpu_check.py`` runs). The package needs neither OpenTelemetry nor otel_llm to start:
it imports them only once a GPU was found. ``--allow-cpu`` lets the server run on the CPU: a trial
of the check's own plumbing on a machine without a GPU, with a stand-in ``pynvml`` module first
on PYTHONPATH (torch_cuda and gpu_memory_consistent then fail, as they should).
"""
