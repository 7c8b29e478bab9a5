"""privbench mechanisms/auditing."""
