"""``python -m otel_llm.testing prepare``: build llama-server and assemble the model ahead of time."""

from otel_llm.testing.llamacpp import main

raise SystemExit(main())
