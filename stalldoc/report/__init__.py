"""Post-mortem reports, built from the run database only."""
