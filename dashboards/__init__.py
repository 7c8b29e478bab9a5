"""privbench dashboards."""
