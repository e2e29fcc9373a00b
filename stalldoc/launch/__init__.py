"""Starting the watched command: agent injection, the job's process tree, signals, exit codes."""
