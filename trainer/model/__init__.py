"""The DFlash drafter and what one training step does to it: attention, blocks, loss, the
optimizer, checkpoints."""
