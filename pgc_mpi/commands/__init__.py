"""The commands layer: the console commands around training (pgc-bench, pgc-plot, pgc-export,
pgc-advise, the options reference's writer, the launch scripts' restart count). They launch
pgc-train as processes and import no mpi4py, nor the runtime or job layers."""
