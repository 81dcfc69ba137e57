"""Field kinds only ``wrap`` takes (no store of the Loader holds them): each one file, on the
core's ``Field`` interface, importing only the core."""
