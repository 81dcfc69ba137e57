"""Storage: the one on-disk format (``store``), known datasets decoded once into it
(``datasets``, ``idxfile``, ``download``), image folders converted into it (``convert``),
image folders read as file bytes for a user's DataLoader (``folder``), and files written
whole or not at all (``fileio``). Imports only the core."""
