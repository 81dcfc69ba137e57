"""Field kinds beyond the core's, on its ``Field`` interface, importing only the core: JPEG files
(and a JPEG store's mover), the 16-bit declaration, audio, video clips."""
