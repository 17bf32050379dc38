"""Fuzzing campaigns: the fuzz loop over Hypothesis, statistics, known bugs, crash confirmation
and cause reruns."""
