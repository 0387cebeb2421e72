"""The builtin targets and datasets that a host builds once into its cache, on first use."""
