package predict

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/plan"
)

// StageRanges returns each stage's layer ranges, one per chunk: a plan's
// model stages in model order, placed as its schedule places them.
func StageRanges(p *plan.Plan, layers int) [][]string {
	out := make([][]string, p.Stages())
	top := p.Topology()
	for k, b := range p.Boundaries {
		end := layers
		if k+1 < len(p.Boundaries) {
			end = p.Boundaries[k+1]
		}
		st, ch := top.Locate(k)
		for len(out[st]) <= ch {
			out[st] = append(out[st], "")
		}
		out[st][ch] = layerRange(b, end-1)
	}
	return out
}

func layerRange(a, b int) string {
	if a == b {
		return strconv.Itoa(a)
	}
	return fmt.Sprintf("%d-%d", a, b)
}

// schemaModeline is the source config's yaml-language-server line, which
// must stay the file's first for editors to find the schema, with a relative
// schema path made relative to out's folder; "" when the source has none.
func schemaModeline(src string, raw []byte, out string) string {
	const prefix = "# yaml-language-server: $schema="
	first, _, _ := strings.Cut(string(raw), "\n")
	ref, ok := strings.CutPrefix(strings.TrimSpace(first), prefix)
	if !ok {
		return ""
	}
	if !strings.Contains(ref, "://") && !filepath.IsAbs(ref) {
		from, err1 := filepath.Abs(filepath.Dir(out))
		to, err2 := filepath.Abs(filepath.Join(filepath.Dir(src), ref))
		if rel, err := filepath.Rel(from, to); err1 == nil && err2 == nil && err == nil {
			ref = filepath.ToSlash(rel)
			if !strings.HasPrefix(ref, ".") {
				ref = "./" + ref
			}
		}
	}
	return prefix + ref + "\n"
}

// WritePlannedConfig rewrites the config's YAML with the plan's stages, schedule,
// micro-batches and replicas, keeping everything else. Stages beyond the config's
// get the last stage's host with the following ports; replicas beyond a stage's
// addresses get its host with ports 100 apart (as validate suggests). It returns
// the stage settings it left out because replicas cannot share them.
// summary, one line, says in the header comment what the plan is.
func WritePlannedConfig(cfg *configs.Config, p *plan.Plan, layers int, out, summary string) (dropped []string, err error) {
	raw, err := os.ReadFile(cfg.Path)
	if err != nil {
		return nil, err
	}
	var doc map[string]any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Path, err)
	}
	r := max(1, p.Replicas)
	ranges := StageRanges(p, layers)
	addrs := plannedAddresses(cfg, len(ranges), r)
	old, _ := doc["stages"].([]any)
	var stagesOut []map[string]any
	for i, chunks := range ranges {
		st := map[string]any{}
		if i < len(old) {
			// Keep the stage's other settings (device, cpus, metrics address).
			if m, ok := old[i].(map[string]any); ok {
				for k, v := range m {
					st[k] = v
				}
			}
		}
		if r == 1 {
			delete(st, "addresses")
			st["address"] = addrs[i][0]
		} else {
			delete(st, "address")
			st["addresses"] = addrs[i]
			for _, k := range []string{"cpus", "metrics_address"} {
				if _, ok := st[k]; ok {
					delete(st, k)
					if !slices.Contains(dropped, k) {
						dropped = append(dropped, k)
					}
				}
			}
		}
		if len(chunks) == 1 {
			st["layers"] = chunks[0]
		} else {
			st["layers"] = chunks
		}
		switch {
		case p.Recompute:
			st["recompute"] = "full"
		case st["recompute"] == "full":
			delete(st, "recompute") // the plan keeps the activations
		}
		stagesOut = append(stagesOut, st)
	}
	doc["stages"] = stagesOut
	doc["schedule"] = p.Schedule
	if v := p.Topology().Chunks; v > 1 {
		doc["virtual_stages"] = v
	} else {
		delete(doc, "virtual_stages")
	}
	if r > 1 {
		doc["data_parallel"] = r
	} else {
		delete(doc, "data_parallel")
	}
	data, _ := doc["data"].(map[string]any)
	if data == nil {
		data = map[string]any{}
	}
	data["micro_batches"] = p.MicroBatches
	doc["data"] = data
	if name, ok := doc["name"].(string); ok {
		doc["name"] = name + "-planned"
	}
	var buf bytes.Buffer
	buf.WriteString(schemaModeline(cfg.Path, raw, out))
	fmt.Fprintf(&buf, "# Written by pipetrain plan from %s on %s: %s\n", cfg.Path, time.Now().Format("2006-01-02"), summary)
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return nil, err
	}
	if err := checkpoint.WriteAtomic(out, func(w io.Writer) error { _, err := w.Write(buf.Bytes()); return err }); err != nil {
		return nil, err
	}
	if _, err := configs.Load(out); err != nil {
		return nil, fmt.Errorf("the planned config does not validate: %w", err)
	}
	return dropped, nil
}

// plannedAddresses gives each of stages stages r addresses, replica 0
// first: the config's where it has them, else, for a stage beyond the
// config's, the port after the last stage's (one more per stage), and for a
// replica beyond a stage's addresses, its replica 0's port plus 100 per
// replica; a port some other process already has moves on to the next free one.
func plannedAddresses(cfg *configs.Config, stages, r int) [][]string {
	out := make([][]string, stages)
	used := map[string]bool{}
	known := func(s, k int) string {
		if s >= len(cfg.Stages) {
			return ""
		}
		if k == 0 {
			return cfg.Address(s, 0)
		}
		if k < len(cfg.Stages[s].Addresses) {
			return cfg.Stages[s].Addresses[k]
		}
		return ""
	}
	for s := range out {
		out[s] = make([]string, r)
		for k := range r {
			if a := known(s, k); a != "" && !used[a] {
				out[s][k], used[a] = a, true
			}
		}
	}
	last := cfg.Stages[len(cfg.Stages)-1].Address
	for s := range out {
		for k := range r {
			if out[s][k] != "" {
				continue
			}
			var a string
			switch {
			case k > 0:
				a = nextAddress(out[s][0], 100*k)
			default:
				a = nextAddress(last, s-len(cfg.Stages)+1)
			}
			for used[a] {
				a = nextAddress(a, 1)
			}
			out[s][k], used[a] = a, true
		}
	}
	return out
}

func nextAddress(addr string, k int) string {
	host, port, _ := strings.Cut(addr, ":")
	n, _ := strconv.Atoi(port)
	return fmt.Sprintf("%s:%d", host, n+k)
}
