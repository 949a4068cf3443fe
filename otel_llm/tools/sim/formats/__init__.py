"""Wire formats of the simulated runtimes, one module per family."""
