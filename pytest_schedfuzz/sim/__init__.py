"""The simulation: a model of ``llama_context``'s scheduler use (the driver) and llama-like graphs,
for the graph properties. Not llama.cpp itself: that is ``llama/``."""
