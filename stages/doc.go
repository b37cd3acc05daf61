// Package stages runs one pipeline stage: it lays the stage out (Layout),
// opens its slice of the model on its device (package compute), connects to its neighbours
// (Connect), and executes its lowered schedule (schedule.Lower: compute,
// sends, receives) op by op, step after step (Runtime, execute.go), writing
// the run directory's logs, metrics, checkpoints and weights. The runtime
// says when; types of their own do the side jobs: metricFiles writes
// metrics.jsonl and eval.json, checkpointer writes, commits and restores
// checkpoints, evaluator runs evaluation passes, replicaSync all-reduces the
// gradients among a stage's replicas and compares their weights. Each
// reaches the chunks' weights and gradients as host tensors through
// compute.Stage, never a device's own types. The same Runtime, holding every layer on one chunk, is the
// one-process reference that pipelined runs must equal bit for bit.
//
// RunProcess is a whole stage process, what pipetrain stage runs once it
// knows its stage and replica: pinning, the rendezvous (Join), the links, the
// Runtime, its metrics endpoint and the gathering of the run's logs. A Go
// program embeds a stage by calling it. What belongs to the whole process
// (the pinning, GOMAXPROCS, the BLAS threads: SetProcessThreads) is set
// there, never by New, so Runtimes built side by side in one process (the
// tests build several) leave each other's settings alone.
//
// # Concurrency
//
// A Runtime is driven by one goroutine, the one that calls Run: every
// action, send, receive, log line of the training loop and file write happens
// there, in schedule order. Only these are safe from other goroutines while
// Run is in progress:
//
//   - Activity, which reads atomics the training goroutine stores (a status
//     query answers from a signal handler's goroutine);
//   - Metrics, whose counters are guarded by their own mutex (the Prometheus
//     handler reads them from its HTTP goroutines).
//
// With replicas, replicaSync's reducer goroutine runs the all-reduces the
// training goroutine hands it, in hand-over order, and owns the replicas'
// ring while one is in progress; it ends before Run returns. Run's
// checkpointer starts goroutines only on stage 0, one per checkpoint, to
// wait for every stage's part and commit the manifest; they end before Run
// returns, and write to the log only one whole line at a time. On a stage
// holding the model's first or last chunk, each forward that reads the dataset
// starts one goroutine (feed.fetch) that reads the next such forward's data
// into a buffer the training goroutine handed it and no longer touches; the
// training goroutine waits for it before that forward, or before Run returns
// (stopFetching), so at most one is running and none outlives Run. The feed's
// mutex serializes every call on the dataset's source, the training
// goroutine's (evaluation passes) and the readers'. The links'
// own goroutines belong to the transport (see transport.Link).
package stages
