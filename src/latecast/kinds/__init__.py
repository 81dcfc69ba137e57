"""Field kinds beyond the core's 8- and 16-bit pixels and integers, each on the core's ``Field``
interface and importing only the core: JPEG files (and the mover of a JPEG store), the 16-bit
declaration, audio, video clips."""
