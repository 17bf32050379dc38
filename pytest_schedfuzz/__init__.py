"""schedfuzz: fuzz ggml's backend scheduler on the real library against a reference model.

``pytest --schedfuzz`` runs the property suite (``plugin``); ``schedfuzz`` is the command
(``cli``). For your own property tests: the Hypothesis strategies in ``strategies``, the data
model in ``scenario``, and the ``schedfuzz_engine`` / ``schedfuzz_reference`` fixtures.
"""
