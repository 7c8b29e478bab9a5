"""privbench workers."""
