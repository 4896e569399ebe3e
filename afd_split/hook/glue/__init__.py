"""Runner glue: what the patched seams do with the runner's own objects."""
