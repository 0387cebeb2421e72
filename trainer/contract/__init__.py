"""The run-dir contract between the trainer and the monitor, as code. Standard library only.

Both halves import it; the agent carries it to the training host (dflash_tui/link/bundle.py),
so it must stay stdlib-only and run on Python >= 3.10. ARCHITECTURE.md ("The contract")
describes the files and their versioning; each module here owns one part:

  typed      records <-> JSON, the one validating decoder, `Unreadable`
  phases     the phases in their real order, every visit and its duration
  heartbeat  heartbeat.json (schema version, thread states)
  ranks      heartbeat-rank{R}.json: one rank of a processes-mode job (its own version)
  records    launch.json, exit.json (and its one writer), metrics.jsonl rows, config.json
  steplines  the step line: formatter and parser side by side
  outcomes   finished / stopped / crashed / killed / died before start, settled once
  checkpoints checkpoint sidecars, and the one rule for the newest good checkpoint
  comparable which earlier runs a run may be compared with
  environment the environment fingerprint and the fast-kernel preflight (config.json `run`)
  evaluation held-out τ during training: the heartbeat's `eval`, a metrics row's
  graphs     CUDA graphs per place the trainer captures them: the heartbeat's `graphs`
  telemetry  telemetry.jsonl, the bounded heartbeat history
  protocol   the agent's events and commands, with their client timeouts
  nodes      one host's place in a job over several hosts; the one run-id naming rule
  codehash   the trainer's code hash
"""
