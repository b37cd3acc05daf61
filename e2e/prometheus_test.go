package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/internal/testenv"
)

// The files deploy/monitoring ships, which the test runs as a user would.
const (
	scrapeConfig = "../deploy/monitoring/prometheus.yml"
	dashboard    = "../deploy/monitoring/grafana.json"
	// monitoredRun is the run label scrapeConfig gives the example's stages.
	monitoredRun = "fmnist-mlp-4stage"
)

// needPrometheus returns the paths of prometheus and promtool, skipping the
// test where either is missing.
func needPrometheus(t *testing.T) (prometheus, promtool string) {
	t.Helper()
	var paths []string
	for _, name := range []string{"prometheus", "promtool"} {
		p, err := exec.LookPath(name)
		if err != nil {
			testenv.RequireOrSkip(t, name+" (Debian package prometheus, which .ci/run installs)", err.Error())
		}
		paths = append(paths, p)
	}
	return paths[0], paths[1]
}

// monitoredConfig writes the default config with stage i at addrs[i], its
// metrics at metrics[i], and a transport token, which the metrics then
// require; it returns the config's path and the token file's.
func monitoredConfig(t *testing.T, dir string, addrs, metrics []string) (cfg, tokenFile string) {
	t.Helper()
	c := loadConfig(t, defaultConfig)
	b, err := os.ReadFile(defaultConfig)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for i, addr := range addrs {
		old := "address: " + c.Stages[i].Address + ","
		if strings.Count(s, old) != 1 {
			t.Fatalf("%s: stage %d's %q is not where the test expects it", defaultConfig, i, old)
		}
		s = strings.Replace(s, old, fmt.Sprintf("address: %s, metrics_address: %q,", addr, metrics[i]), 1)
	}
	if strings.Count(s, "\ntransport:\n") != 1 {
		t.Fatalf("%s: no transport section", defaultConfig)
	}
	s = strings.Replace(s, "\ntransport:\n", "\ntransport:\n  token_file: run.token\n", 1)
	cfg, tokenFile = filepath.Join(dir, "monitored.yaml"), filepath.Join(dir, "run.token")
	if err := os.WriteFile(tokenFile, []byte("e2e-prometheus-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	for i, st := range loadConfig(t, cfg).Stages {
		if st.MetricsAddress != metrics[i] {
			t.Fatalf("stage %d serves metrics on %q, want %q", i, st.MetricsAddress, metrics[i])
		}
	}
	return cfg, tokenFile
}

// promConfig is the shipped scrape config made to scrape this test's stages
// every second with the run's token.
func promConfig(t *testing.T, metrics []string, tokenFile string) string {
	t.Helper()
	b, err := os.ReadFile(scrapeConfig)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	replace := func(old, new string) {
		t.Helper()
		if strings.Count(s, old) != 1 {
			t.Fatalf("%s no longer holds %q once: update the test with it", scrapeConfig, old)
		}
		s = strings.Replace(s, old, new, 1)
	}
	replace("scrape_interval: 5s", "scrape_interval: 1s")
	replace("evaluation_interval: 5s", "evaluation_interval: 1s")
	for i, m := range metrics {
		replace(fmt.Sprintf(`"127.0.0.1:910%d"`, i+1), strconv.Quote(m))
	}
	replace("    # authorization:\n    #   type: Bearer\n    #   credentials_file: /etc/prometheus/pipetrain/run.token\n",
		"    authorization:\n      type: Bearer\n      credentials_file: "+tokenFile+"\n")
	return s
}

// process is a program the test started, stopped when the test ends.
type process struct {
	cmd    *exec.Cmd
	out    *syncBuffer
	exited chan struct{} // closed once it has exited and been waited for
}

// startProcess starts cmd; the test's end stops it with stop, then SIGKILL
// if it has not exited within grace (an error: it should have).
func startProcess(t *testing.T, cmd *exec.Cmd, stop syscall.Signal, grace time.Duration) *process {
	t.Helper()
	p := &process{cmd: cmd, out: &syncBuffer{}, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", cmd.Path, err)
	}
	go func() {
		cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		if !p.running() {
			return
		}
		cmd.Process.Signal(stop)
		select {
		case <-p.exited:
			return
		case <-time.After(grace):
		}
		cmd.Process.Kill()
		<-p.exited
		t.Errorf("%s ignored %v for %v; killed:\n%s", filepath.Base(cmd.Path), stop, grace, p.out.String())
	})
	return p
}

func (p *process) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// get reads url, with "Authorization: Bearer token" unless token is "".
func get(t *testing.T, url, token string) (int, string, error) {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// promSample is one series of an instant vector from Prometheus's HTTP API.
type promSample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"` // unix time, value as a string
}

func (s promSample) float(t *testing.T) float64 {
	t.Helper()
	str, _ := s.Value[1].(string)
	v, err := strconv.ParseFloat(str, 64)
	if err != nil {
		t.Fatalf("series %v: value %v", s.Metric, s.Value)
	}
	return v
}

// promAPI reads a path of Prometheus's HTTP API at addr into data.
func promAPI(t *testing.T, addr, path string, data any) {
	t.Helper()
	code, body, err := get(t, "http://"+addr+path, "")
	if err != nil {
		t.Fatalf("Prometheus API %s: %v", path, err)
	}
	var reply struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal([]byte(body), &reply); err != nil || code != http.StatusOK || reply.Status != "success" {
		t.Fatalf("Prometheus API %s: status %d, %s %v: %s", path, code, reply.Error, err, body)
	}
	if err := json.Unmarshal(reply.Data, data); err != nil {
		t.Fatalf("Prometheus API %s: %v: %s", path, err, reply.Data)
	}
}

// promQuery evaluates expr now and returns its series by stage label,
// failing on a series without one.
func promQuery(t *testing.T, addr, expr string) map[string][]promSample {
	t.Helper()
	var data struct {
		ResultType string       `json:"resultType"`
		Result     []promSample `json:"result"`
	}
	promAPI(t, addr, "/api/v1/query?query="+url.QueryEscape(expr), &data)
	if data.ResultType != "vector" {
		t.Fatalf("%s: a %s, not an instant vector", expr, data.ResultType)
	}
	byStage := map[string][]promSample{}
	for _, s := range data.Result {
		stage, ok := s.Metric["stage"]
		if !ok {
			t.Fatalf("%s: series %v has no stage label", expr, s.Metric)
		}
		byStage[stage] = append(byStage[stage], s)
	}
	return byStage
}

// dashboardExprs returns the PromQL of every panel of the shipped dashboard
// with its variables set as Grafana would for run and all stages.
func dashboardExprs(t *testing.T, run, rateWindow string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(dashboard)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboard, err)
	}
	vars := strings.NewReplacer("$__rate_interval", rateWindow, "$run", regexp.QuoteMeta(run), "$stage", ".*")
	out := map[string]string{}
	for _, p := range d.Panels {
		for i, q := range p.Targets {
			out[fmt.Sprintf("%s #%d", p.Title, i+1)] = vars.Replace(q.Expr)
		}
	}
	if len(out) < 6 {
		t.Fatalf("%s: %d queries; its panels hold more", dashboard, len(out))
	}
	return out
}

// TestPrometheusScrapesLiveRun launches the default 4-stage config with
// metrics on every stage and a token, lints each stage's metrics with
// promtool, scrapes them with a real Prometheus running the shipped scrape
// config, and reads back through Prometheus's API each stage's step time and
// bubble and every query of the shipped dashboard.
func TestPrometheusScrapesLiveRun(t *testing.T) {
	needData(t)
	prometheus, promtool := needPrometheus(t)
	started := time.Now()
	dir := t.TempDir()
	ports := freePorts(t, 9)
	addrs, metrics, promAddr := ports[:4], ports[4:8], ports[8]
	cfg, tokenFile := monitoredConfig(t, dir, addrs, metrics)
	tokenBytes, err := os.ReadFile(tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	token := strings.TrimSpace(string(tokenBytes))

	runDir := filepath.Join(dir, "run")
	// The stages die with launch; none may outlive the test. Registered
	// first, this runs after launch is stopped.
	t.Cleanup(func() {
		deadline := time.Now().Add(10 * time.Second)
		for i := range addrs {
			for stagePID(t, runDir, i) != 0 && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
			if pid := stagePID(t, runDir, i); pid != 0 {
				t.Errorf("stage %d (pid %d) outlived launch; killing it", i, pid)
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	// The run trains until the test ends it, so it outlasts whatever
	// Prometheus takes to start and scrape, however slow the machine.
	launch := startProcess(t, exec.Command(binary, "launch", "--config", cfg, "--steps", "1000000", "--run-dir", runDir), syscall.SIGINT, 20*time.Second)

	// Every stage serves its metrics, to the token only, and they pass
	// Prometheus's linter once a few steps are in them.
	for i, m := range metrics {
		url := "http://" + m + "/metrics"
		steps := regexp.MustCompile(fmt.Sprintf(`(?m)^pipetrain_steps_total\{stage="%d"\} (\d+)$`, i))
		var body string
		for deadline := time.Now().Add(2 * time.Minute); ; {
			code, b, err := get(t, url, token)
			if s := steps.FindStringSubmatch(b); err == nil && code == http.StatusOK && s != nil {
				if n, _ := strconv.Atoi(s[1]); n >= 3 {
					body = b
					break
				}
			}
			if time.Now().After(deadline) || !launch.running() {
				t.Fatalf("stage %d: no metrics with 3 steps on %s (last: %d %v):\n%s", i, url, code, err, launch.out.String())
			}
			time.Sleep(100 * time.Millisecond)
		}
		if code, _, err := get(t, url, ""); err != nil || code != http.StatusUnauthorized {
			t.Errorf("stage %d: a scrape without the token got %d %v, want 401", i, code, err)
		}
		for _, family := range []string{"pipetrain_train_seconds_total", "pipetrain_busy_seconds_total", "pipetrain_idle_seconds_total", "pipetrain_samples_total", "pipetrain_sent_bytes_total"} {
			if !strings.Contains(body, fmt.Sprintf("\n%s{stage=\"%d\"", family, i)) {
				t.Errorf("stage %d: no %s series:\n%s", i, family, body)
			}
		}
		lint := exec.Command(promtool, "check", "metrics")
		lint.Stdin = strings.NewReader(body)
		if out, err := lint.CombinedOutput(); err != nil || len(strings.TrimSpace(string(out))) > 0 {
			t.Errorf("stage %d: promtool check metrics: %v\n%s\nmetrics:\n%s", i, err, out, body)
		}
	}

	// Prometheus, with the shipped scrape config pointed at this run.
	promCfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(promCfg, []byte(promConfig(t, metrics, tokenFile)), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{scrapeConfig, promCfg} {
		if out, err := exec.Command(promtool, "check", "config", c).CombinedOutput(); err != nil {
			t.Fatalf("promtool check config %s: %v\n%s", c, err, out)
		}
	}
	prom := startProcess(t, exec.Command(prometheus, "--config.file="+promCfg, "--storage.tsdb.path="+filepath.Join(dir, "tsdb"),
		"--web.listen-address="+promAddr), syscall.SIGTERM, 15*time.Second)

	// Wait until it has every stage up.
	type target struct {
		Labels    map[string]string `json:"labels"`
		Health    string            `json:"health"`
		LastError string            `json:"lastError"`
	}
	var targets struct {
		Active []target `json:"activeTargets"`
	}
	for deadline := time.Now().Add(time.Minute); ; {
		up := 0
		if code, _, err := get(t, "http://"+promAddr+"/-/ready", ""); err == nil && code == http.StatusOK {
			promAPI(t, promAddr, "/api/v1/targets?state=active", &targets)
			for _, tg := range targets.Active {
				if tg.Health == "up" {
					up++
				}
			}
		}
		if up == len(metrics) && len(targets.Active) == len(metrics) {
			break
		}
		if time.Now().After(deadline) || !prom.running() || !launch.running() {
			t.Fatalf("Prometheus has %d of %d targets up: %+v\nprometheus:\n%s\nlaunch:\n%s", up, len(metrics), targets.Active, prom.out.String(), launch.out.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, tg := range targets.Active {
		if tg.Labels["run"] != monitoredRun || tg.Labels["job"] != "pipetrain" {
			t.Errorf("target %v: want job pipetrain and run %s", tg.Labels, monitoredRun)
		}
	}

	// Step time and bubble of every stage, as rates over the last scrapes:
	// they need two scrapes in the window, so they may take a few seconds.
	const window = "[5s]"
	stepTime := "rate(pipetrain_train_seconds_total" + window + ") / rate(pipetrain_steps_total" + window + ")"
	bubble := "rate(pipetrain_idle_seconds_total" + window + ") / (rate(pipetrain_idle_seconds_total" + window + ") + rate(pipetrain_busy_seconds_total" + window + "))"
	allStages := []string{"0", "1", "2", "3"}
	have := func(byStage map[string][]promSample) bool {
		for _, s := range allStages {
			if len(byStage[s]) != 1 {
				return false
			}
		}
		return len(byStage) == len(allStages)
	}
	var times, bubbles map[string][]promSample
	for deadline := time.Now().Add(time.Minute); ; {
		if times, bubbles = promQuery(t, promAddr, stepTime), promQuery(t, promAddr, bubble); have(times) && have(bubbles) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a minute, step time by stage %v, bubble by stage %v; want one series for each of stages 0-3\nprometheus:\n%s", times, bubbles, prom.out.String())
		}
		time.Sleep(500 * time.Millisecond)
	}
	for _, s := range allStages {
		st, b := times[s][0].float(t), bubbles[s][0].float(t)
		if !(st > 0 && st < 60) {
			t.Errorf("stage %s: step time %v s through Prometheus", s, st)
		}
		if !(b >= 0 && b <= 1) {
			t.Errorf("stage %s: bubble %v through Prometheus, want a fraction", s, b)
		}
		t.Logf("stage %s: step time %.1f ms, bubble %.0f%%", s, 1000*st, 100*b)
	}

	// Every query of the dashboard answers for every stage of the run.
	exprs := dashboardExprs(t, monitoredRun, window[1:len(window)-1])
	names := make([]string, 0, len(exprs))
	for name := range exprs {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		byStage := promQuery(t, promAddr, exprs[name])
		for _, s := range allStages {
			if len(byStage[s]) == 0 {
				t.Errorf("dashboard panel %s: no series for stage %s from %s (got %v)", name, s, exprs[name], byStage)
			}
			for _, v := range byStage[s] {
				if f := v.float(t); math.IsNaN(f) || math.IsInf(f, 0) {
					t.Errorf("dashboard panel %s: stage %s: %v from %s", name, s, f, exprs[name])
				}
			}
		}
	}
	var runs []string
	promAPI(t, promAddr, "/api/v1/label/run/values?match[]=pipetrain_steps_total", &runs)
	if !slices.Equal(runs, []string{monitoredRun}) {
		t.Errorf("the dashboard's run selector would offer %v, want [%s]", runs, monitoredRun)
	}
	t.Logf("run up, linted, scraped and queried in %v", time.Since(started).Round(100*time.Millisecond))
}
