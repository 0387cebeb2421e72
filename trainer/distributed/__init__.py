"""Processes mode: one process per rank under torchrun, its layout, transfers, resume and
signals."""
