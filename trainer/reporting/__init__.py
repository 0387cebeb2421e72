"""What a run tells the world: its live state, stage times, memory, the heartbeat, train.log,
metrics."""
