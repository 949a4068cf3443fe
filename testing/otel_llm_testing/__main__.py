"""``python -m otel_llm_testing prepare``: build llama-server and assemble the model ahead of time."""

from otel_llm_testing.llama_server import main

raise SystemExit(main())
