"""The built-in demo: a torchrun gloo job in which one rank hangs."""
