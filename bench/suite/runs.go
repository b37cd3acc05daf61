package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"

	"go.yaml.in/yaml/v3"

	"github.com/pipetrain/pipetrain/stages"
)

// runConfig derives a config for one benchmark run from a file in configs/.
type runConfig struct {
	base     string   // the config it is derived from
	schedule string   // "" keeps the base's
	micro    int      // micro-batches; 0 keeps the base's
	env      []string // further PIPETRAIN_* settings
	steps    int      // training steps
	layers   []string // one layer range per stage; nil keeps the base's stages
	replicas int      // data_parallel; 0 keeps the base's
	// addrs, if set, are the addresses of a one-stage grid's replicas
	// (fresh loopback ports otherwise).
	addrs []string
	// set holds further settings: section, key, value; a nil section
	// deletes the base's.
	set      map[string]map[string]any
	evaluate bool // evaluate after the last step (eval.json); off by default
}

// write writes the derived config into dir with a fresh free loopback port per
// stage and parameter server, evaluation (unless rc.evaluate), checkpoints and
// restarts off, and returns its path.
func (rc runConfig) write(dir string) (string, error) {
	raw, err := os.ReadFile(rc.base)
	if err != nil {
		return "", err
	}
	var doc map[string]any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return "", fmt.Errorf("%s: %w", rc.base, err)
	}
	if rc.schedule != "" {
		doc["schedule"] = rc.schedule
	}
	sub := func(key string) map[string]any {
		m, _ := doc[key].(map[string]any)
		if m == nil {
			m = map[string]any{}
			doc[key] = m
		}
		return m
	}
	if rc.micro > 0 {
		sub("data")["micro_batches"] = rc.micro
	}
	train := sub("train")
	train["steps"] = rc.steps
	train["evaluate"] = rc.evaluate
	train["eval_every"] = 0
	train["log_every"] = rc.steps
	sub("checkpoint")["every"] = 0
	sub("recovery")["max_restarts"] = 0
	for section, kv := range rc.set {
		if kv == nil {
			delete(doc, section)
		}
		for k, v := range kv {
			sub(section)[k] = v
		}
	}
	var stageList []any
	if rc.layers != nil {
		for _, l := range rc.layers {
			stageList = append(stageList, map[string]any{"layers": l})
		}
	} else {
		list, ok := doc["stages"].([]any)
		if !ok {
			return "", fmt.Errorf("%s: no stages list", rc.base)
		}
		for _, s := range list {
			m, ok := s.(map[string]any)
			if !ok {
				return "", fmt.Errorf("%s: a stage is not a mapping", rc.base)
			}
			c := map[string]any{}
			for k, v := range m {
				c[k] = v
			}
			stageList = append(stageList, c)
		}
	}
	if rc.replicas > 0 {
		doc["data_parallel"] = rc.replicas
	}
	replicas := 1
	if n, ok := doc["data_parallel"].(int); ok && n > 1 {
		replicas = n
	}
	// One call for all the ports, servers' included: two calls could be
	// handed one port.
	ports, err := freePorts(len(stageList)*replicas + serverCount(doc))
	if err != nil {
		return "", err
	}
	for _, s := range stageList {
		m := s.(map[string]any)
		delete(m, "address")
		delete(m, "addresses")
		var addrs []any
		for r := range replicas {
			if r < len(rc.addrs) {
				addrs = append(addrs, rc.addrs[r])
				continue
			}
			addrs = append(addrs, "127.0.0.1:"+strconv.Itoa(ports[0]))
			ports = ports[1:]
		}
		if replicas == 1 {
			m["address"] = addrs[0]
		} else {
			m["addresses"] = addrs
		}
	}
	doc["stages"] = stageList
	serverPorts(doc, ports)
	out, err := yaml.Marshal(doc)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "config.yaml")
	header := fmt.Sprintf("# Written by bench/suite from %s for one benchmark run.\n", rc.base)
	return path, os.WriteFile(path, append([]byte(header), out...), 0o644)
}

// serverCount is the parameter_servers.count of doc (0 without).
func serverCount(doc map[string]any) int {
	ps, _ := doc["parameter_servers"].(map[string]any)
	n, _ := ps["count"].(int)
	return max(n, 0)
}

// serverPorts gives the parameter servers of doc, if any, the first of
// ports.
func serverPorts(doc map[string]any, ports []int) {
	n := serverCount(doc)
	if n == 0 {
		return
	}
	var addrs []any
	for _, p := range ports[:n] {
		addrs = append(addrs, "127.0.0.1:"+strconv.Itoa(p))
	}
	ps := doc["parameter_servers"].(map[string]any)
	ps["addresses"] = addrs
	delete(ps, "metrics_addresses")
}

// freePorts asks the kernel for n distinct loopback ports that are free now:
// every listener stays open until all n are chosen, or the kernel may hand
// out a port just closed again (two stages of a run were once given one).
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// runEnv is the environment of every pipetrain run: the derived config already
// says all of this, the variables make sure nothing in the caller's environment
// overrides it.
func runEnv(rc runConfig) []string {
	env := []string{
		"PIPETRAIN_TRAIN_EVALUATE=" + strconv.FormatBool(rc.evaluate),
		"PIPETRAIN_TRAIN_STEPS=" + strconv.Itoa(rc.steps),
		"PIPETRAIN_CHECKPOINT_EVERY=0",
		"PIPETRAIN_RECOVERY_MAX_RESTARTS=0",
	}
	if rc.schedule != "" {
		env = append(env, "PIPETRAIN_SCHEDULE="+rc.schedule)
	}
	if rc.micro > 0 {
		env = append(env, "PIPETRAIN_DATA_MICRO_BATCHES="+strconv.Itoa(rc.micro))
	}
	return append(env, rc.env...)
}

// pipetrain runs `bin command --config ... --run-dir ...` for rc in a fresh
// temporary directory and returns that directory (the caller removes it) and
// the derived config's path.
func pipetrain(o *options, command string, rc runConfig) (dir, cfgPath string, err error) {
	dir, err = os.MkdirTemp("", "pipetrain-suite-")
	if err != nil {
		return "", "", err
	}
	cfgPath, err = rc.write(dir)
	if err != nil {
		os.RemoveAll(dir)
		return "", "", err
	}
	runDir := filepath.Join(dir, "run")
	args := []string{command, "--config", cfgPath, "--run-dir", runDir}
	if command == "reference" {
		// The reference counts as stage 0, as the end-to-end section's
		// comparison says, not as the whole machine.
		args = append(args, "--pipeline-threads")
	}
	cmd := exec.Command(o.bin, args...)
	cmd.Env = append(os.Environ(), runEnv(rc)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return "", "", fmt.Errorf("%s %s (from %s): %v\n%s", filepath.Base(o.bin), command, rc.base, err, tail(out, 2000))
	}
	return dir, cfgPath, nil
}

// stepTimes returns the per-step wall times in ms of a run's steps after skip,
// from the last stage's metrics.jsonl, and the samples per second over them.
func stepTimes(runDir string, batch, skip int) (ms []float64, samplesPerSec float64, err error) {
	metrics, err := stages.ReadMetrics(filepath.Join(runDir, "metrics.jsonl"))
	if err != nil {
		return nil, 0, err
	}
	if len(metrics) <= skip {
		return nil, 0, fmt.Errorf("%s: %d steps logged, need more than %d", runDir, len(metrics), skip)
	}
	for _, m := range metrics[skip:] {
		ms = append(ms, float64(batch)/m.SamplesPerSec*1e3)
	}
	// Elapsed time between the end of step skip and the end of the last step.
	var first stages.Metric
	if skip > 0 {
		first = metrics[skip-1]
	}
	last := metrics[len(metrics)-1]
	samplesPerSec = float64((last.Step-first.Step)*batch) / (last.ElapsedSec - first.ElapsedSec)
	return ms, samplesPerSec, nil
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
