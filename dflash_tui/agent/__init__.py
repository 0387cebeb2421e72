"""dflash-tui agent: runs next to the trainer, streams what happens, carries out commands.

Standard library only (plus `pynvml` when importable), Python >= 3.10. It travels as one
self-contained script together with the run-dir contract (dflash_tui/link/bundle.py builds
it): the link starts `python -u -c <bootstrap>` and sends that script on stdin, so the agent
always matches the monitor's version and nothing needs installing remotely. Deploy writes the
same script next to the trainer as dflash_agent.py, where launched runs use its `wrap` mode.

Its events and commands are records of trainer/contract/protocol.py (JSON lines both ways).
One job per module:

  main      arguments and the two modes: serve (the default) and wrap
  output    JSON lines on stdout, each line whole, from any thread
  stdin     command lines from stdin: bounded, decoded at the boundary, never fatal
  loop      the select loop: the followed run's files, the runs list, liveness, dispatch
  files     reading a run's files (never through a symlink, never blocked by a FIFO); one
            file's new lines, heartbeat.json changes, inotify
  pages     a page of a run's file by byte range (the step log paged back to its start)
  gpus      NVML, else nvidia-smi, else a clear "no GPU"
  host      the host: CPUs, load, CPU use, memory, free disk under the run root
  procs     what /proc says about a process: alive, started when, in which group, which locks
  proc_table  the followed run's proven process group sampled (pid, state, CPU, RSS), and
            one signal to one member of it (the thread/process table's rows)
  runs      the run root: which folders are runs, the launch lock, the one liveness rule
  identity  whose process a signal may reach: the run's, proven (`prove`, once per
            command: the run dir, pid, start and group as `Proven`), or none
  commands  every command's handler, by command record, given the agent as the AgentState
            it declares (the loop passes itself; commands never imports the loop)
  rank_watch  the followed job's heartbeat-rank files, re-read when they change
  rank_stacks  dump-stacks of a processes-mode job: every rank's dump, headed by its rank
  launch    starting a run under the launch lock (a restart's: `--resume` its parent)
  resume    what a restart continues: a run's newest good checkpoint, read without torch
  kill      stopping a proven run's process group and waiting for its GPU memory
  deploy    unpacking a release, trusted by its hash before any of it runs
  release_check  restart --deploy's check that a new release imports, before the kill
  export    the trainer's `export` of a run's drafter, run from the release into exports/
  wrap      the detached parent of one trainer run: starts it, writes exit.json
  oom       after a SIGKILL: the memory cgroup's oom_kill count and the kernel log

Runs live in RUN_ROOT/<run_id>/. While a launched run lives, RUN_ROOT/.launch.lock is
flock-ed: the agent takes the lock, hands it to the detached wrapper (and that to the
trainer), and the kernel releases it when the last of them exits. Not a guess from pids.
No signal leaves the agent before identity.prove has shown that its target is the run's.
"""
