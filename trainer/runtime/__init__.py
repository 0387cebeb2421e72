"""One threads-mode run: set-up, warm-up, the pipeline threads, signals, run dirs."""
