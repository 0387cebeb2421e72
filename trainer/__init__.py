"""A DFlash drafter trainer: frozen target features, a block-diffusion drafter, a run dir."""
