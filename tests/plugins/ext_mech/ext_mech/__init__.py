"""An example privbench plugin (see docs/plugins.md): a mechanism, a model and a dataset."""
