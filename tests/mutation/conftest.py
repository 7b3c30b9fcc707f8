"""The mutation runner is a script, not a test module: pytest collects nothing here."""

collect_ignore_glob = ["*"]
