"""What a stall looks like across ranks: stack groups, culprit frames, collective alignment."""
