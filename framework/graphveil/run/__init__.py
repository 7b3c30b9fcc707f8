"""A run: its configuration, the training session, the runner that writes its outputs, and the
stores a run keeps between rounds or runs (record sets, prepared set-up); planning accounts a run
from public sizes with the session's own code."""
