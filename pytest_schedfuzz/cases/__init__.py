"""Saved cases: the corpus files, minimization and drawing."""
