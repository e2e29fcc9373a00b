"""The in-process agent (standard library only: it runs inside every rank of the watched job)."""
