"""The driver side of privbench: CLI, grid parsing and validation, Ray submission, resume."""
