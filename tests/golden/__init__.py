"""The golden run: a fixed tiny run whose per-step numbers are stored here and compared in the default suite."""
