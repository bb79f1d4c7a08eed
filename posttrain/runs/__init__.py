"""What every command leaves behind: run directories, checkpoints, the shared step loop,
the console, live monitors and the finished run's report and plots."""
