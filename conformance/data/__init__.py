"""The data a check reads: the workspace (generated datasets, and datasets derived from the user's own
samples), reading crude samples, inferring a dataset's format, and member variants inside their format."""
