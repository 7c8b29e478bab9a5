"""privbench storage."""
