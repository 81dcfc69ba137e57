"""What only the users of another framework need: latecast at its edge (imports only the core)."""
