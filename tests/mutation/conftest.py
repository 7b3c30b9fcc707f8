"""The mutation runner and its ``sitecustomize`` are scripts, not test modules: pytest collects
only ``test_*.py`` here (the check that every mutant still applies)."""

collect_ignore = ["run_mutants.py", "sitecustomize.py"]
