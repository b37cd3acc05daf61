// Package predict says what a config will do before it is launched: each
// stage's action costs per micro-batch (ResolveCosts: timed here, read from a
// run's events, or given), which stages share cores while they compute
// (StageCores), what the data-parallel replicas' all-reduces cost
// (NewReplication), each stage's peak activation memory under a schedule
// (MemoryPredictor); for the planner, each layer's costs (PlanLayers) and the
// cores its processes share (SharePlanCores); and, once a plan is chosen, the
// config that runs it (WritePlannedConfig).
//
// It is a package of its own because it stands between two kinds of
// package: schedule and plan are pure models over plain values (they import
// nothing of configs, models or the engine), while the figures those models
// take come from configs, models, the engine (which times and measures),
// profile (which reads a run) and collective (which cuts the buckets).
// predict joins them, so that pipetrain simulate and pipetrain plan only
// parse their flags and print what it returns, and a Go program can make the
// same predictions.
//
// Costs are in milliseconds, the simulator's unit; sizes in bytes.
package predict
